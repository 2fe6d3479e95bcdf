//! A decision cache that is never stale: the key is the **complete** fact set (every slot's
//! value, environment switches, device and library versions included, floats by bit pattern,
//! plus the raw text of unparseable versions) together with a fingerprint of the policy (its
//! name, every source text and its layer switches). Two inputs share an entry only when a
//! decision could not tell them apart.
//!
//! Key: a [`FactsKey`], the exact word encoding of the facts (a prefix code: equal keys are
//! bitwise-equal facts) and its hash, computed once per `Facts` and memoised there (every
//! mutating method of `Facts` drops it; a clone starts without it). A hit compares the key by
//! pointer (the same `Facts` again) or with one slice compare.
//!
//! Layout: a fixed number of shards, each a small set-associative table behind an `RwLock`
//! (lookups take the read lock; only misses take the write lock). Each shard holds at most
//! `ways` entries and evicts with the CLOCK algorithm (a referenced bit set on a hit when it
//! is not set yet). Counters (hits, misses, insertions, evictions) are striped over
//! cache-padded cells so concurrent readers do not bounce one cache line.
//!
//! ```
//! use attn_policy::{CachedPolicy, Facts, Policy};
//! let cached = CachedPolicy::new(Policy::embedded("te").unwrap(), 1024);
//! let facts = Facts::from_json(&serde_json::json!({"head_dim_qk": 128})).unwrap();
//! let a = cached.decide(&facts); // miss: decides and stores
//! let b = cached.decide(&facts); // hit: the memoised key, a shard lookup, a pointer compare
//! assert!(std::sync::Arc::ptr_eq(&a, &b));
//! assert_eq!(cached.cache().stats().hits, 1);
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use crate::decision::Decision;
use crate::facts::Facts;
pub use crate::facts::key::FactsKey;
use crate::facts::key::{MUL, SEED, avalanche, mix};
use crate::policy::Policy;

/// The slot hash of (policy, facts).
#[inline(always)]
fn entry_hash(tag: u64, key: &FactsKey) -> u64 {
    avalanche(key.hash ^ tag.wrapping_mul(MUL))
}

#[inline(always)]
fn same_key(a: &Arc<FactsKey>, b: &Arc<FactsKey>) -> bool {
    Arc::ptr_eq(a, b) || a.words == b.words
}

/// The identity of a policy for cache keys: its name, the text of every source file (pack and
/// overlays) and its layer switches. Compute it once per loaded policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PolicyKey(pub u64);

impl PolicyKey {
    pub fn of(policy: &Policy) -> PolicyKey {
        let mut h = mix(SEED, policy.disabled_layers);
        let mut bytes = |s: &str| {
            h = mix(h, s.len() as u64);
            for chunk in s.as_bytes().chunks(8) {
                let mut w = [0u8; 8];
                w[..chunk.len()].copy_from_slice(chunk);
                h = mix(h, u64::from_le_bytes(w));
            }
        };
        bytes(&policy.name);
        for f in &policy.sources.files {
            bytes(&f.name);
            bytes(&f.text);
        }
        PolicyKey(h)
    }
}

/// Counter snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub inserts: u64,
    pub evictions: u64,
    /// Entries held now.
    pub len: usize,
    /// Most entries the cache will hold.
    pub capacity: usize,
}

impl CacheStats {
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

struct Entry {
    hash: u64,
    tag: u64,
    key: Arc<FactsKey>,
    decision: Arc<Decision>,
    referenced: AtomicBool,
}

#[derive(Default)]
struct Shard {
    /// Hashes of the entries, scanned first (one cache line holds eight).
    hashes: Vec<u64>,
    entries: Vec<Entry>,
    hand: usize,
}

#[repr(align(128))]
#[derive(Default)]
struct Stripe {
    hits: AtomicU64,
    misses: AtomicU64,
    inserts: AtomicU64,
    evictions: AtomicU64,
}

const STRIPES: usize = 32;

fn stripe_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    INDEX.with(|i| *i)
}

/// A bounded, thread-safe map from (policy, complete facts) to a shared decision.
pub struct DecisionCache {
    shards: Box<[RwLock<Shard>]>,
    ways: usize,
    stripes: Box<[Stripe]>,
}

impl std::fmt::Debug for DecisionCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecisionCache")
            .field("stats", &self.stats())
            .finish()
    }
}

impl DecisionCache {
    /// A cache holding at most about `capacity` decisions (rounded up to whole shards; a
    /// capacity of 0 still keeps one entry per shard).
    pub fn new(capacity: usize) -> DecisionCache {
        let shards = if capacity >= 1024 {
            64
        } else if capacity >= 64 {
            16
        } else {
            1
        };
        let ways = capacity.div_ceil(shards).max(1);
        DecisionCache {
            shards: (0..shards).map(|_| RwLock::new(Shard::default())).collect(),
            ways,
            stripes: (0..STRIPES).map(|_| Stripe::default()).collect(),
        }
    }

    fn shard(&self, hash: u64) -> &RwLock<Shard> {
        &self.shards[(hash >> 58) as usize % self.shards.len()]
    }

    fn stripe(&self) -> &Stripe {
        &self.stripes[stripe_index()]
    }

    /// The cached decision for these facts under this policy, if any (counts a hit or a miss).
    pub fn get(&self, key: PolicyKey, facts: &Facts) -> Option<Arc<Decision>> {
        let fk = facts.cache_key();
        self.lookup(key, entry_hash(key.0, fk), fk)
    }

    /// Counts a hit that a caller's own memo answered (the Python binding's input memo sits in
    /// front of this cache), so `stats()` covers every decision served from a cache.
    pub fn count_hit(&self) {
        self.stripe().hits.fetch_add(1, Ordering::Relaxed);
    }

    /// [`get`](Self::get) for a key computed by the caller (`FactsKey::of`).
    pub fn get_key(&self, key: PolicyKey, fk: &Arc<FactsKey>) -> Option<Arc<Decision>> {
        self.lookup(key, entry_hash(key.0, fk), fk)
    }

    #[inline]
    fn lookup(&self, key: PolicyKey, hash: u64, fk: &Arc<FactsKey>) -> Option<Arc<Decision>> {
        let found = {
            let shard = self
                .shard(hash)
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            shard
                .hashes
                .iter()
                .enumerate()
                .filter(|(_, h)| **h == hash)
                .map(|(i, _)| &shard.entries[i])
                .find(|e| e.tag == key.0 && same_key(&e.key, fk))
                .map(|e| {
                    if !e.referenced.load(Ordering::Relaxed) {
                        e.referenced.store(true, Ordering::Relaxed);
                    }
                    e.decision.clone()
                })
        };
        let s = self.stripe();
        match &found {
            Some(_) => s.hits.fetch_add(1, Ordering::Relaxed),
            None => s.misses.fetch_add(1, Ordering::Relaxed),
        };
        found
    }

    /// Stores a decision (replacing an equal key's entry; evicting by CLOCK when full).
    pub fn insert(&self, key: PolicyKey, facts: &Facts, decision: Arc<Decision>) {
        let fk = facts.cache_key();
        self.insert_hashed(key, entry_hash(key.0, fk), fk, decision);
    }

    fn insert_hashed(
        &self,
        key: PolicyKey,
        hash: u64,
        fk: &Arc<FactsKey>,
        decision: Arc<Decision>,
    ) {
        let mut shard = self
            .shard(hash)
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let shard = &mut *shard;
        if let Some(e) = shard
            .entries
            .iter_mut()
            .find(|e| e.hash == hash && e.tag == key.0 && same_key(&e.key, fk))
        {
            e.decision = decision;
            return;
        }
        let entry = Entry {
            hash,
            tag: key.0,
            key: fk.clone(),
            decision,
            referenced: AtomicBool::new(false),
        };
        let s = self.stripe();
        s.inserts.fetch_add(1, Ordering::Relaxed);
        if shard.entries.len() < self.ways {
            shard.hashes.push(hash);
            shard.entries.push(entry);
            return;
        }
        // CLOCK: clear referenced bits until an unreferenced entry comes round.
        loop {
            let i = shard.hand % shard.entries.len();
            shard.hand = i + 1;
            let e = &shard.entries[i];
            if e.referenced.swap(false, Ordering::Relaxed) {
                continue;
            }
            shard.hashes[i] = hash;
            shard.entries[i] = entry;
            s.evictions.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }

    /// The cached decision, or `policy.decide(facts)` stored for next time. `key` must be
    /// `PolicyKey::of(policy)` (see [`CachedPolicy`], which keeps the two together).
    pub fn get_or_decide(&self, key: PolicyKey, policy: &Policy, facts: &Facts) -> Arc<Decision> {
        let fk = facts.cache_key();
        let hash = entry_hash(key.0, fk);
        if let Some(d) = self.lookup(key, hash, fk) {
            return d;
        }
        let d = Arc::new(policy.decide(facts));
        self.insert_hashed(key, hash, fk, d.clone());
        d
    }

    /// Drops every entry (counters are kept).
    pub fn clear(&self) {
        for s in self.shards.iter() {
            let mut s = s.write().unwrap_or_else(|p| p.into_inner());
            s.entries.clear();
            s.hashes.clear();
            s.hand = 0;
        }
    }

    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(|p| p.into_inner()).entries.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        self.ways * self.shards.len()
    }

    pub fn stats(&self) -> CacheStats {
        let sum = |f: fn(&Stripe) -> &AtomicU64| -> u64 {
            self.stripes
                .iter()
                .map(|s| f(s).load(Ordering::Relaxed))
                .sum()
        };
        CacheStats {
            hits: sum(|s| &s.hits),
            misses: sum(|s| &s.misses),
            inserts: sum(|s| &s.inserts),
            evictions: sum(|s| &s.evictions),
            len: self.len(),
            capacity: self.capacity(),
        }
    }

    /// Zeroes the counters.
    pub fn reset_stats(&self) {
        for s in self.stripes.iter() {
            for c in [&s.hits, &s.misses, &s.inserts, &s.evictions] {
                c.store(0, Ordering::Relaxed);
            }
        }
    }
}

/// A policy with its own decision cache: the usual way to embed (Python and C use this).
#[derive(Debug)]
pub struct CachedPolicy {
    policy: Arc<Policy>,
    key: PolicyKey,
    cache: DecisionCache,
}

impl CachedPolicy {
    pub fn new(policy: Policy, capacity: usize) -> CachedPolicy {
        CachedPolicy::from_arc(Arc::new(policy), capacity)
    }

    pub fn from_arc(policy: Arc<Policy>, capacity: usize) -> CachedPolicy {
        CachedPolicy {
            key: PolicyKey::of(&policy),
            policy,
            cache: DecisionCache::new(capacity),
        }
    }

    /// The decision for `facts`, from the cache when these exact facts were decided before.
    pub fn decide(&self, facts: &Facts) -> Arc<Decision> {
        self.cache.get_or_decide(self.key, &self.policy, facts)
    }

    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    pub fn key(&self) -> PolicyKey {
        self.key
    }

    pub fn cache(&self) -> &DecisionCache {
        &self.cache
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Value;
    use serde_json::json;

    fn facts(v: serde_json::Value) -> Facts {
        Facts::from_json(&v).unwrap()
    }

    fn te() -> Policy {
        Policy::embedded("te").unwrap()
    }

    #[test]
    fn hit_returns_the_same_decision_and_counts() {
        let c = CachedPolicy::new(te(), 64);
        let f = facts(json!({"head_dim_qk": 128, "head_dim_v": 128}));
        let a = c.decide(&f);
        let b = c.decide(&f);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(*a, c.policy().decide(&f));
        let s = c.cache().stats();
        assert_eq!((s.hits, s.misses, s.inserts, s.len), (1, 1, 1, 1));
    }

    #[test]
    fn environment_device_and_versions_are_part_of_the_key() {
        let c = CachedPolicy::new(te(), 64);
        let base = json!({"head_dim_qk": 128, "head_dim_v": 128});
        let variants = [
            json!({"env": {"NVTE_FLASH_ATTN": "0"}}),
            json!({"device_compute_capability": [8, 0]}),
            json!({"device_compute_capability": [10, 0]}),
            json!({"cudnn_version": [9, 13, 0]}),
            json!({"flash_attn_versions": {"v2": "2.7.4"}}),
            json!({"fp8": true, "fp8_recipe": {"recipe": "DelayedScaling", "fp8_dpa": true}}),
        ];
        let d0 = c.decide(&facts(base.clone()));
        for v in &variants {
            let mut cfg = base.clone();
            for (k, x) in v.as_object().unwrap() {
                cfg[k] = x.clone();
            }
            let f = facts(cfg);
            let d = c.decide(&f);
            assert!(!Arc::ptr_eq(&d0, &d), "{v} must not hit the base entry");
            assert_eq!(*d, c.policy().decide(&f), "{v}");
        }
        assert_eq!(c.cache().stats().hits, 0);
        assert_eq!(c.cache().stats().misses, 1 + variants.len() as u64);
    }

    #[test]
    fn floats_compare_by_bit_pattern() {
        let c = CachedPolicy::new(te(), 64);
        let a = facts(json!({"attention_dropout": 0.0}));
        let b = facts(json!({"attention_dropout": -0.0}));
        c.decide(&a);
        c.decide(&b);
        assert_eq!(c.cache().stats().hits, 0);
    }

    #[test]
    fn a_changed_facts_value_never_hits_its_old_entry() {
        let c = CachedPolicy::new(te(), 64);
        let mut f = facts(json!({"head_dim_qk": 128, "head_dim_v": 128}));
        c.decide(&f);
        c.decide(&f);
        assert_eq!(c.cache().stats().hits, 1);
        // Every public mutation forgets the memoised key.
        f.set_all_probes(true);
        assert_eq!(*c.decide(&f), c.policy().decide(&f));
        f.set_probe("fused_attn_graph", Some(false)).unwrap();
        assert_eq!(*c.decide(&f), c.policy().decide(&f));
        f.set_probe("fused_attn_graph", None).unwrap();
        assert_eq!(*c.decide(&f), c.policy().decide(&f));
        let s = c.cache().stats();
        assert_eq!((s.hits, s.misses), (1, 4));
        // A clone starts without the key: equal facts hit, through a key of its own.
        let g = f.clone();
        assert!(!Arc::ptr_eq(f.cache_key(), g.cache_key()));
        assert_eq!(f.cache_key(), g.cache_key());
        c.decide(&g);
        assert_eq!(c.cache().stats().hits, 2);
    }

    /// Bitwise equality of two fact sets, as the key must see it.
    fn bitwise_equal(a: &Facts, b: &Facts) -> bool {
        let same = |x: &Value, y: &Value| match (x, y) {
            (Value::Float(p), Value::Float(q)) => p.to_bits() == q.to_bits(),
            _ => x == y,
        };
        a.values().len() == b.values().len()
            && a.values().iter().zip(b.values()).all(|(x, y)| same(x, y))
            && a.raw_versions == b.raw_versions
    }

    #[test]
    fn keys_are_equal_exactly_when_facts_are_bitwise_equal() {
        let mut sets: Vec<Facts> = vec![
            facts(json!({})),
            facts(json!({"cudnn_version": [9, 1, 0]})),
            // Collided in the old (lossy) version hash: 9<<42 ^ 1<<21 == 9<<42 ^ 2^21.
            facts(json!({"cudnn_version": [9, 0, 2097152]})),
            facts(json!({"flash_attn_versions": {"v2": "2.8.3"}})),
            facts(json!({"flash_attn_versions": {"v2": "2.8.3rc1"}})),
            facts(json!({"flash_attn_versions": {"v2": "2.8.3.dev1"}})),
            // The third version state: present but unparseable, keyed by its raw text.
            facts(json!({"cudnn_frontend_version": "1.29.x-custom"})),
            facts(json!({"cudnn_frontend_version": "1.29.y-custom"})),
            facts(json!({"cudnn_frontend_version": "1.29.0"})),
            facts(json!({"env": {"NVTE_FLASH_ATTN": "0"}})),
            facts(json!({"env": {"NVTE_FUSED_ATTN": "0"}})),
            facts(json!({"attention_dropout": 0.0})),
            facts(json!({"attention_dropout": -0.0})),
            facts(json!({"attention_dropout": 0.1})),
            facts(json!({"attention_dropout": 0.1 + f64::EPSILON / 16.0})),
            facts(json!({"window_size": [-1, 0]})),
            facts(json!({"window_size": null})),
        ];
        // NaNs by payload (not reachable from JSON; a float slot written directly).
        let float_slot = crate::facts::te::slot("attention_dropout").unwrap();
        for bits in [
            0x7FF8_0000_0000_0000u64,
            0x7FF8_0000_0000_0001,
            0x7FF8_0000_0000_0001,
        ] {
            let mut f = facts(json!({}));
            f.values[float_slot] = Value::Float(f64::from_bits(bits));
            sets.push(f);
        }
        for a in &sets {
            for b in &sets {
                assert_eq!(
                    bitwise_equal(a, b),
                    FactsKey::of(a) == FactsKey::of(b),
                    "{:?} vs {:?}",
                    a.get("attention_dropout"),
                    b.get("attention_dropout")
                );
            }
        }
        // And the cache gives each distinct set its own decision.
        let c = CachedPolicy::new(te(), 64);
        for f in &sets {
            assert_eq!(*c.decide(f), c.policy().decide(f));
        }
        let distinct = (0..sets.len())
            .filter(|&i| (0..i).all(|j| !bitwise_equal(&sets[i], &sets[j])))
            .count() as u64;
        assert_eq!(c.cache().stats().misses, distinct);
    }

    #[test]
    fn layer_switches_change_the_policy_key() {
        let mut p = te();
        let on = PolicyKey::of(&p);
        if let Some(layer) = p.layers.get(1).cloned() {
            p.set_layer_enabled(&layer, false).unwrap();
            assert_ne!(on, PolicyKey::of(&p));
        }
        let cache = DecisionCache::new(16);
        let f = facts(json!({}));
        cache.insert(on, &f, Arc::new(Decision::default()));
        assert!(cache.get(on, &f).is_some());
        assert!(cache.get(PolicyKey(on.0 ^ 1), &f).is_none());
    }

    #[test]
    fn bounded_with_clock_eviction() {
        let cache = DecisionCache::new(8);
        let p = te();
        let key = PolicyKey::of(&p);
        for i in 0..100 {
            cache.get_or_decide(key, &p, &facts(json!({"batch_size": i + 1})));
        }
        let s = cache.stats();
        assert_eq!(s.capacity, 8);
        assert_eq!(s.len, 8);
        assert_eq!(s.inserts, 100);
        assert_eq!(s.evictions, 92);
        // A referenced entry survives the next eviction round.
        let hot = facts(json!({"batch_size": 100}));
        assert!(cache.get(key, &hot).is_some());
        cache.get_or_decide(key, &p, &facts(json!({"batch_size": 1000})));
        assert!(cache.get(key, &hot).is_some());
    }

    #[test]
    fn concurrent_readers_and_writers_agree_with_uncached_decide() {
        let c = Arc::new(CachedPolicy::new(te(), 32));
        let inputs: Vec<Facts> = (0..64)
            .map(|i| facts(json!({"head_dim_qk": 64 + 8 * i, "head_dim_v": 64 + 8 * i})))
            .collect();
        let expected: Vec<Decision> = inputs.iter().map(|f| c.policy().decide(f)).collect();
        std::thread::scope(|s| {
            for t in 0..8 {
                let (c, inputs, expected) = (&c, &inputs, &expected);
                s.spawn(move || {
                    for k in 0..2000 {
                        let i = (k * 7 + t * 13) % inputs.len();
                        assert_eq!(*c.decide(&inputs[i]), expected[i]);
                    }
                });
            }
        });
        let s = c.cache().stats();
        assert_eq!(s.hits + s.misses, 16000);
        assert!(s.len <= s.capacity);
    }
}

//! A decision cache that is never stale: the key is the **complete** fact set (every slot's
//! value, environment switches, device and library versions included, floats by bit pattern,
//! plus the raw text of unparseable versions) together with a fingerprint of the policy (its
//! name, every source text and its layer switches). Two inputs share an entry only when a
//! decision could not tell them apart.
//!
//! Layout: a fixed number of shards, each a small set-associative table behind an `RwLock`
//! (lookups take the read lock; only misses take the write lock). Each shard holds at most
//! `ways` entries and evicts with the CLOCK algorithm (a referenced bit set on every hit).
//! Counters (hits, misses, insertions, evictions) are striped over cache-padded cells so
//! concurrent readers do not bounce one cache line.
//!
//! ```
//! use attn_policy::cache::CachedPolicy;
//! use attn_policy::{Facts, Policy};
//! let cached = CachedPolicy::new(Policy::embedded("te").unwrap(), 1024);
//! let facts = Facts::from_json(&serde_json::json!({"head_dim_qk": 128})).unwrap();
//! let a = cached.decide(&facts); // miss: decides and stores
//! let b = cached.decide(&facts); // hit: a hash and a compare
//! assert!(std::sync::Arc::ptr_eq(&a, &b));
//! assert_eq!(cached.cache().stats().hits, 1);
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use crate::decision::Decision;
use crate::facts::{Facts, Value};
use crate::policy::Policy;

const SEED: u64 = 0x9E37_79B9_7F4A_7C15;
const MUL: u64 = 0xF135_7AEA_2E62_A9C5;

#[inline(always)]
fn mix(h: u64, w: u64) -> u64 {
    (h ^ w).wrapping_mul(MUL).rotate_left(26)
}

/// One value as (tag, payload) words: floats by bit pattern, versions with their pre-release.
#[inline(always)]
fn words(v: &Value) -> (u64, u64) {
    match *v {
        Value::Null => (0, 0),
        Value::Unknown => (1, 0),
        Value::Bool(b) => (2, b as u64),
        Value::Int(i) => (3, i as u64),
        Value::Float(f) => (4, f.to_bits()),
        Value::Enum(e) => (5, e as u64),
        Value::Version(ver) => {
            let p = ver.parts;
            let pre = ver
                .pre
                .map_or(0, |(k, n)| ((k as u64 + 1) << 32) | n as u64);
            (
                6 ^ (pre << 8),
                (p[0] as u64) << 42 ^ (p[1] as u64) << 21 ^ p[2] as u64,
            )
        }
        Value::BadVersion => (7, 0),
    }
}

/// Bitwise equality of two values (so `NaN == NaN` and `0.0 != -0.0`, unlike `PartialEq`).
#[inline(always)]
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
        _ => a == b,
    }
}

fn facts_hash(tag: u64, facts: &Facts) -> u64 {
    let mut h = mix(SEED, tag);
    for v in facts.values() {
        let (t, p) = words(v);
        h = mix(mix(h, t), p);
    }
    for (slot, raw) in &facts.raw_versions {
        h = mix(h, *slot as u64);
        for chunk in raw.as_bytes().chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            h = mix(h, u64::from_le_bytes(w));
        }
    }
    // Final avalanche (splitmix64) so shard and slot bits are well spread.
    h ^= h >> 30;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^ (h >> 31)
}

fn facts_equal(a: &Facts, b: &Facts) -> bool {
    let (x, y) = (a.values(), b.values());
    x.len() == y.len()
        && x.iter().zip(y).all(|(p, q)| same(p, q))
        && a.raw_versions == b.raw_versions
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
    facts: Facts,
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
        self.lookup(key, facts_hash(key.0, facts), facts)
    }

    fn lookup(&self, key: PolicyKey, hash: u64, facts: &Facts) -> Option<Arc<Decision>> {
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
                .find(|e| e.tag == key.0 && facts_equal(&e.facts, facts))
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
        self.insert_hashed(key, facts_hash(key.0, facts), facts, decision);
    }

    fn insert_hashed(&self, key: PolicyKey, hash: u64, facts: &Facts, decision: Arc<Decision>) {
        let mut shard = self
            .shard(hash)
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let shard = &mut *shard;
        if let Some(e) = shard
            .entries
            .iter_mut()
            .find(|e| e.hash == hash && e.tag == key.0 && facts_equal(&e.facts, facts))
        {
            e.decision = decision;
            return;
        }
        let entry = Entry {
            hash,
            tag: key.0,
            facts: facts.clone(),
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
        let hash = facts_hash(key.0, facts);
        if let Some(d) = self.lookup(key, hash, facts) {
            return d;
        }
        let d = Arc::new(policy.decide(facts));
        self.insert_hashed(key, hash, facts, d.clone());
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
    fn unparseable_version_text_is_part_of_the_key() {
        let c = CachedPolicy::new(te(), 64);
        let a = facts(json!({"flash_attn_versions": {"v2": "garbage-a"}}));
        let b = facts(json!({"flash_attn_versions": {"v2": "garbage-b"}}));
        c.decide(&a);
        c.decide(&b);
        assert_eq!(c.cache().stats().misses, 2);
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

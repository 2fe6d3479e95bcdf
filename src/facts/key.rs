//! The exact key of a fact set ([`FactsKey`]), memoised per `Facts` value ([`KeyMemo`]): what
//! the decision cache (`crate::cache`) looks decisions up by. It lives with the facts so that
//! `Facts` need not know the cache. It is computed from a fact set's parts (slot values and
//! unparseable version texts), so `Facts`, which holds a [`KeyMemo`], can be declared on top
//! of this file: `FactsKey::of` and `Facts::cache_key` are in `input.rs`.

use std::sync::{Arc, OnceLock};

use super::value::Value;

pub(crate) const SEED: u64 = 0x9E37_79B9_7F4A_7C15;
pub(crate) const MUL: u64 = 0xF135_7AEA_2E62_A9C5;

#[inline(always)]
pub(crate) fn mix(h: u64, w: u64) -> u64 {
    (h ^ w).wrapping_mul(MUL).rotate_left(26)
}

/// splitmix64's finaliser: spreads every input bit over the shard and slot bits.
#[inline(always)]
pub(crate) fn avalanche(mut h: u64) -> u64 {
    h ^= h >> 30;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94D0_49BB_1331_11EB);
    h ^ (h >> 31)
}

/// The exact cache key of a fact set, encoded once: the number of slots, then every slot as a
/// tag word followed by its payload words (ints and floats one word, floats by bit pattern so
/// `0.0 != -0.0` and `NaN == NaN`; versions three words, pre-release included), then every
/// unparseable version's slot, byte length and bytes. The tag word says how many payload words
/// follow, so the encoding is a prefix code: two fact sets have equal keys exactly when every
/// slot is bitwise equal and their unparseable version texts are equal. A lookup compares keys
/// with one slice compare (or a pointer compare for the same `Facts`).
#[derive(Debug, PartialEq, Eq)]
pub struct FactsKey {
    /// A hash of `words` (not of the policy; the cache mixes the `PolicyKey` in).
    pub hash: u64,
    pub words: Box<[u64]>,
}

impl FactsKey {
    /// The key of a fact set given as its slot values and its unparseable versions' raw texts
    /// (`(slot, text)`); [`FactsKey::of`] for a `Facts`.
    pub(crate) fn of_parts(values: &[Value], raw_versions: &[(usize, String)]) -> FactsKey {
        let words = encode(values, raw_versions);
        FactsKey {
            hash: hash_words(&words),
            words: words.into_boxed_slice(),
        }
    }
}

pub(crate) fn encode(values: &[Value], raw_versions: &[(usize, String)]) -> Vec<u64> {
    let mut w = Vec::with_capacity(values.len() * 2 + 1);
    w.push(values.len() as u64);
    for v in values {
        match *v {
            Value::Null => w.push(0),
            Value::Unknown => w.push(1),
            Value::Bool(b) => w.push(2 | (b as u64) << 8),
            Value::Int(i) => w.extend([3, i as u64]),
            Value::Float(f) => w.extend([4, f.to_bits()]),
            Value::Enum(e) => w.push(5 | (e as u64) << 8),
            Value::Version(ver) => {
                let (kind, n) = ver.pre.map_or((0, 0), |(k, n)| (k as u64 + 1, n as u64));
                let p = ver.parts;
                w.extend([
                    6 | kind << 8 | n << 32,
                    p[0] as u64 | (p[1] as u64) << 32,
                    p[2] as u64,
                ]);
            }
            Value::BadVersion => w.push(7),
        }
    }
    for (slot, raw) in raw_versions {
        w.extend([*slot as u64, raw.len() as u64]);
        w.extend(raw.as_bytes().chunks(8).map(|c| {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(b)
        }));
    }
    w
}

/// Four independent multiply lanes (no serial dependency from one word to the next).
fn hash_words(words: &[u64]) -> u64 {
    let mut lanes = [SEED, SEED ^ MUL, SEED.rotate_left(17), MUL.rotate_left(31)];
    let mut chunks = words.chunks_exact(4);
    for c in &mut chunks {
        for i in 0..4 {
            lanes[i] = mix(lanes[i], c[i]);
        }
    }
    let mut h = mix(SEED, words.len() as u64);
    for &x in chunks.remainder() {
        h = mix(h, x);
    }
    for l in lanes {
        h = mix(h, l);
    }
    avalanche(h)
}

/// The per-`Facts` memo of its [`FactsKey`]: filled on the first cache lookup, emptied by every
/// mutation through `Facts`' methods, and empty in a clone (so a clone that is then changed
/// never carries a stale key). It takes no part in `Facts`' equality.
#[derive(Default)]
pub struct KeyMemo(OnceLock<Arc<FactsKey>>);

impl KeyMemo {
    /// The memoised key, computed by `key` on first use.
    #[inline]
    pub(crate) fn get_or_init(&self, key: impl FnOnce() -> FactsKey) -> &Arc<FactsKey> {
        self.0.get_or_init(|| Arc::new(key()))
    }

    /// Forgets the key (call on every change of the facts).
    #[inline]
    pub(crate) fn clear(&mut self) {
        self.0.take();
    }
}

impl Clone for KeyMemo {
    fn clone(&self) -> KeyMemo {
        KeyMemo::default()
    }
}

impl PartialEq for KeyMemo {
    fn eq(&self, _: &KeyMemo) -> bool {
        true
    }
}

impl std::fmt::Debug for KeyMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "KeyMemo(set)"
        } else {
            "KeyMemo"
        })
    }
}

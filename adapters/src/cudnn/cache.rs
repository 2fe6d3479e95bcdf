//! The plan cache: plans only (never buffers), keyed by everything a plan depends on.
//!
//! The key holds the device ordinal, the graph kind (direction and native/composite), the whole
//! [`SdpaSpec`] (b, heads, lengths, head dims, dtype, every tensor's strides, the canonical
//! mask band and window, the deterministic flag, the sequence packing) and the runtime cuDNN
//! version. Per-sequence lengths are data the executor writes per call, not part of the key:
//! one plan serves every length mix of a packing (only the longest lengths, and the strides
//! that depend on a packed token count, are in it). The softmax scale
//! is a by-value scalar given per call, so it is not part of the key. Refusals are cached too, so
//! a probe or a declined call does not rebuild a graph cuDNN already refused.

use std::collections::HashMap;
use std::hash::Hash;

use super::graph::GraphKind;
use super::spec::SdpaSpec;
use super::version::CudnnVersion;

/// Cache key of one execution plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PlanKey {
    /// CUDA device ordinal (plans embed the device's SM cubins).
    pub device: usize,
    /// Which graph.
    pub kind: GraphKind,
    /// Shapes, strides, dtype, mask, window, deterministic flag.
    pub spec: SdpaSpec,
    /// Runtime cuDNN version.
    pub version: CudnnVersion,
}

/// Hit/miss counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that built (or refused) a plan.
    pub misses: u64,
    /// Entries held.
    pub entries: usize,
}

/// A map from [`PlanKey`] to a cached value (a plan or a refusal).
#[derive(Debug)]
pub struct PlanCache<K: Eq + Hash, V> {
    map: HashMap<K, V>,
    hits: u64,
    misses: u64,
}

impl<K: Eq + Hash, V> Default for PlanCache<K, V> {
    fn default() -> Self {
        PlanCache {
            map: HashMap::new(),
            hits: 0,
            misses: 0,
        }
    }
}

impl<K: Eq + Hash, V: Clone> PlanCache<K, V> {
    /// The cached value for `key`, or the one `build` makes (then cached); the flag says
    /// whether it was a hit. An `Err` from `build` is returned and not cached.
    pub fn get_or_try_insert_with<E>(
        &mut self,
        key: K,
        build: impl FnOnce() -> Result<V, E>,
    ) -> Result<(V, bool), E> {
        if let Some(v) = self.map.get(&key) {
            self.hits += 1;
            return Ok((v.clone(), true));
        }
        self.misses += 1;
        let v = build()?;
        self.map.insert(key, v.clone());
        Ok((v, false))
    }

    /// Counters.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits,
            misses: self.misses,
            entries: self.map.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cudnn::spec::{Diagonal, IoDtype, MaskSpec, SeqPacking, bshd_strides};

    fn key() -> PlanKey {
        PlanKey {
            device: 0,
            kind: GraphKind::CompositeFwd,
            spec: SdpaSpec::dense_bhsd(2, 8, 4, 128, 128, 64, IoDtype::Bf16, MaskSpec::CAUSAL),
            version: CudnnVersion(91900),
        }
    }

    #[test]
    fn every_plan_dependency_separates_keys() {
        let base = key();
        let mut variants: Vec<PlanKey> = Vec::new();
        let mut k = base;
        k.device = 1;
        variants.push(k);
        let mut k = base;
        k.kind = GraphKind::NativeFwd;
        variants.push(k);
        let mut k = base;
        k.version = CudnnVersion(92100);
        variants.push(k);
        for f in [
            |s: &mut SdpaSpec| s.b = 3,
            |s: &mut SdpaSpec| s.h_q = 16,
            |s: &mut SdpaSpec| s.h_kv = 8,
            |s: &mut SdpaSpec| s.s_q = 64,
            |s: &mut SdpaSpec| s.s_kv = 256,
            |s: &mut SdpaSpec| s.d_qk = 128,
            |s: &mut SdpaSpec| s.d_v = 128,
            |s: &mut SdpaSpec| s.dtype = IoDtype::F16,
            |s: &mut SdpaSpec| s.mask = MaskSpec::NONE,
            |s: &mut SdpaSpec| {
                s.mask = MaskSpec {
                    left: Some(64),
                    ..MaskSpec::CAUSAL
                }
            },
            |s: &mut SdpaSpec| {
                s.mask = MaskSpec {
                    left: Some(32),
                    ..MaskSpec::CAUSAL
                }
            },
            |s: &mut SdpaSpec| s.mask.diagonal = Diagonal::BottomRight,
            |s: &mut SdpaSpec| s.layouts.q = bshd_strides(8, 128, 64),
            |s: &mut SdpaSpec| s.layouts.k = bshd_strides(4, 128, 64),
            |s: &mut SdpaSpec| s.layouts.v = bshd_strides(4, 128, 64),
            |s: &mut SdpaSpec| s.layouts.o = bshd_strides(8, 128, 64),
            |s: &mut SdpaSpec| s.layouts.grads.as_mut().unwrap().dq = bshd_strides(8, 128, 64),
            |s: &mut SdpaSpec| s.deterministic = true,
            |s: &mut SdpaSpec| s.seqlens = Some(SeqPacking::PaddedRight),
            |s: &mut SdpaSpec| s.seqlens = Some(SeqPacking::PaddedLeft),
            |s: &mut SdpaSpec| s.seqlens = Some(SeqPacking::Packed),
        ] {
            let mut k = base;
            f(&mut k.spec);
            variants.push(k);
        }
        let mut cache: PlanCache<PlanKey, usize> = PlanCache::default();
        cache
            .get_or_try_insert_with(base, || Ok::<_, ()>(0))
            .unwrap();
        for (i, k) in variants.iter().enumerate() {
            let (v, hit) = cache
                .get_or_try_insert_with(*k, || Ok::<_, ()>(i + 1))
                .unwrap();
            assert!(!hit, "variant {i} collided with an earlier key: {k:?}");
            assert_eq!(v, i + 1);
        }
        assert_eq!(
            cache.stats(),
            CacheStats {
                hits: 0,
                misses: variants.len() as u64 + 1,
                entries: variants.len() + 1
            }
        );
    }

    #[test]
    fn a_repeat_is_a_hit_and_build_errors_are_not_cached() {
        let mut cache: PlanCache<PlanKey, &str> = PlanCache::default();
        assert_eq!(
            cache.get_or_try_insert_with(key(), || Err::<&str, _>("boom")),
            Err("boom")
        );
        assert_eq!(
            cache.get_or_try_insert_with(key(), || Ok::<_, ()>("plan")),
            Ok(("plan", false))
        );
        let (v, hit) = cache
            .get_or_try_insert_with(key(), || Err("not called"))
            .unwrap();
        assert_eq!((v, hit), ("plan", true));
        assert_eq!(cache.stats().hits, 1);
    }
}

//! Runtime cuDNN version gates (`cudnnGetVersion()`, e.g. 91900 for 9.19.0).
//!
//! cudarc binds the 9.21 enums; attributes newer than the loaded library fail with BAD_PARAM,
//! so every 9.21-only attribute is chosen here, from the runtime version, never from headers.

use std::fmt;

use super::spec::{Direction, SdpaSpec};

/// A cuDNN runtime version as `cudnnGetVersion()` reports it (major*10000 + minor*100 + patch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CudnnVersion(pub u32);

impl CudnnVersion {
    /// Major version.
    pub fn major(self) -> u32 {
        self.0 / 10000
    }
    /// Minor version.
    pub fn minor(self) -> u32 {
        (self.0 / 100) % 100
    }
    /// Patch version.
    pub fn patch(self) -> u32 {
        self.0 % 100
    }

    /// The native `OPERATION_SDPA_FWD` op (cudnn-frontend's UNIFIED lowering floor, 9.13.1).
    pub fn has_native_sdpa(self) -> bool {
        self.0 >= 91301
    }

    /// `SDPA_FWD_SUBGRAPH` / `SOFTMAX_DESC` and the `DIAGONAL_BAND_MASK` / `SOFTMAX` ops as the
    /// frontend uses them: 9.21.
    pub fn has_sdpa_subgraph(self) -> bool {
        self.0 >= 92100
    }

    /// Why this version cannot run a composite SDPA graph for `spec`, if it cannot.
    pub fn unsupported_reason(self, spec: &SdpaSpec, dir: Direction) -> Option<String> {
        if self.major() < 9 || self.0 < 90600 {
            return Some(format!(
                "cuDNN {self} is older than 9.6.0, the oldest this executor builds SDPA graphs for"
            ));
        }
        if self.0 == 91000 || self.0 == 91001 {
            return Some(format!(
                "cuDNN {self} has a known fp16/bf16 SDPA defect (cudnn-frontend refuses 9.10.0/9.10.1)"
            ));
        }
        // the frontend's workaround is a padding mask, which graphs with per-sequence lengths
        // carry anyway
        if self.0 <= 91500 && spec.s_kv % 128 != 0 && spec.seqlens.is_none() {
            return Some(format!(
                "cuDNN {self} needs a padding-mask workaround for s_kv % 128 != 0 (s_kv = {}), not implemented here",
                spec.s_kv
            ));
        }
        if self.0 == 91400
            && spec.mask.left.is_some()
            && spec.mask.right.is_none()
            && spec.s_kv > 1024
        {
            return Some(format!(
                "cuDNN {self} has a sliding-window defect for non-causal s_kv > 1024"
            ));
        }
        if dir == Direction::Backward && spec.s_q == 1 && spec.s_kv == 1 {
            return Some("cuDNN has no SDPA backward for s_q = s_kv = 1".to_string());
        }
        None
    }
}

impl fmt::Display for CudnnVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major(), self.minor(), self.patch())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cudnn::spec::{IoDtype, MaskSpec};

    #[test]
    fn version_parts_and_gates() {
        let v = CudnnVersion(91900);
        assert_eq!((v.major(), v.minor(), v.patch()), (9, 19, 0));
        assert_eq!(v.to_string(), "9.19.0");
        assert!(v.has_native_sdpa());
        assert!(!v.has_sdpa_subgraph());
        assert!(CudnnVersion(92100).has_sdpa_subgraph());
        assert!(!CudnnVersion(91300).has_native_sdpa());
        assert!(CudnnVersion(91301).has_native_sdpa());
    }

    #[test]
    fn unsupported_versions_name_the_reason() {
        let s = SdpaSpec::dense_bhsd(1, 1, 1, 100, 100, 64, IoDtype::Bf16, MaskSpec::CAUSAL);
        assert!(
            CudnnVersion(90500)
                .unsupported_reason(&s, Direction::Forward)
                .unwrap()
                .contains("9.6.0")
        );
        assert!(
            CudnnVersion(91001)
                .unsupported_reason(&s, Direction::Forward)
                .unwrap()
                .contains("9.10")
        );
        assert!(
            CudnnVersion(91400)
                .unsupported_reason(&s, Direction::Forward)
                .unwrap()
                .contains("128")
        );
        assert_eq!(
            CudnnVersion(91900).unsupported_reason(&s, Direction::Forward),
            None
        );
        let one = SdpaSpec::dense_bhsd(1, 1, 1, 1, 1, 64, IoDtype::Bf16, MaskSpec::NONE);
        assert!(
            CudnnVersion(91900)
                .unsupported_reason(&one, Direction::Backward)
                .is_some()
        );
        assert!(
            CudnnVersion(91900)
                .unsupported_reason(&one, Direction::Forward)
                .is_none()
        );
    }
}

//! The rules of TransformerEngine PR #3527 for the `frost` executor, as pure, CPU-tested Rust
//! (no Python, no device):
//! - version probes: a pre-release is below its floor (`1.29.0rc1 < 1.29.0`); an unparseable
//!   version defers to the plan-name check; only absence declines;
//! - the engines are enabled (`CUDNN_FRONTEND_ENABLE_FROST_ENGINES=1`) before the import;
//! - the selected plan is checked by name: a non-FROST (backend or other) plan is refused, never
//!   silently run; deterministic execution is declined (cuDNN has no deterministic FROST backward);
//! - the plan-cache key includes the device (type, index).
//!
//! What `mod.rs`, the bridge and its stand-in share; it names none of them (no circle of files).

use std::cmp::Ordering;
use std::fmt;

use crate::cudnn::convert::mask_of;
use crate::cudnn::spec::{Direction, MaskSpec};
use crate::executor::{DeviceKind, HeadDimRange, Manifest, Unsupported};
use crate::problem::{AttentionProblem, DType, LayoutKind, MaskKind};

/// Registry name.
pub const NAME: &str = "frost";
/// Environment switch that offers the opt-in FROST rows; set before `import cudnn`.
pub const ENABLE_ENV: &str = "CUDNN_FRONTEND_ENABLE_FROST_ENGINES";
/// Distribution name of the cuDNN frontend.
pub const FRONTEND_DIST: &str = "nvidia-cudnn-frontend";
/// Distribution name of the CuTe DSL.
pub const CUTLASS_DSL_DIST: &str = "nvidia-cutlass-dsl";
/// First frontend release with the FROST d512 backward: 1.29.0.
pub fn frontend_floor() -> PyVersion {
    PyVersion::release(1, 29, 0)
}
/// FROST enforces 4.7.0 at plan build (the frontend declares only 4.6.2): below it every FROST
/// engine silently declines and backend plans come back with no error.
pub fn cutlass_dsl_floor() -> PyVersion {
    PyVersion::release(4, 7, 0)
}

/// Pre-release kinds, ordered as PEP 440 orders them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pre {
    /// `.devN` (before any pre-release of the same release).
    Dev(u64),
    /// `aN`.
    Alpha(u64),
    /// `bN`.
    Beta(u64),
    /// `rcN`.
    Rc(u64),
}

/// A PEP 440 version, reduced to what ordering needs: release, pre/dev, post (local ignored).
/// Equality is ordering equality (`1.29 == 1.29.0`).
#[derive(Clone, Debug)]
pub struct PyVersion {
    /// Release numbers (`1.29.0` -> [1, 29, 0]).
    pub release: Vec<u64>,
    /// Pre-release or dev marker (None: final).
    pub pre: Option<Pre>,
    /// `.postN`.
    pub post: Option<u64>,
}

impl PyVersion {
    /// A final release `a.b.c`.
    pub fn release(a: u64, b: u64, c: u64) -> PyVersion {
        PyVersion {
            release: vec![a, b, c],
            pre: None,
            post: None,
        }
    }

    /// Parses `1.29.0`, `v1.29`, `1.29.0rc1`, `4.0.0b11`, `1.30.0.dev2`, `1.29.0.post1`,
    /// `1.29.0+cu13`; None when it is not a version.
    pub fn parse(raw: &str) -> Option<PyVersion> {
        let s = raw.trim().to_ascii_lowercase();
        let s = s.strip_prefix('v').unwrap_or(&s);
        let s = s.split('+').next()?; // local version label
        let mut release = Vec::new();
        let mut rest = s;
        loop {
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            if end == 0 {
                return None;
            }
            release.push(rest[..end].parse().ok()?);
            rest = &rest[end..];
            match rest.strip_prefix('.') {
                Some(r) if r.starts_with(|c: char| c.is_ascii_digit()) => rest = r,
                _ => break,
            }
        }
        let mut pre = None;
        let mut post = None;
        while !rest.is_empty() {
            let r = rest.trim_start_matches(['.', '-', '_']);
            let (kind, tail) = if let Some(t) = r.strip_prefix("rc") {
                ("rc", t)
            } else if let Some(t) = r.strip_prefix("dev") {
                ("dev", t)
            } else if let Some(t) = r.strip_prefix("post") {
                ("post", t)
            } else if let Some(t) = r.strip_prefix('a') {
                ("a", t)
            } else if let Some(t) = r.strip_prefix('b') {
                ("b", t)
            } else {
                return None;
            };
            let end = tail
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(tail.len());
            let n: u64 = if end == 0 {
                0
            } else {
                tail[..end].parse().ok()?
            };
            rest = &tail[end..];
            match kind {
                "rc" => pre = Some(Pre::Rc(n)),
                "a" => pre = Some(Pre::Alpha(n)),
                "b" => pre = Some(Pre::Beta(n)),
                "dev" => pre = pre.or(Some(Pre::Dev(n))),
                _ => post = Some(n),
            }
        }
        Some(PyVersion { release, pre, post })
    }
}

impl PartialEq for PyVersion {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for PyVersion {}

impl PartialOrd for PyVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for PyVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        let (ra, pa, qa) = (&self.release, self.pre, self.post);
        let (rb, pb, qb) = (&other.release, other.pre, other.post);
        let n = ra.len().max(rb.len());
        for i in 0..n {
            let (x, y) = (
                ra.get(i).copied().unwrap_or(0),
                rb.get(i).copied().unwrap_or(0),
            );
            if x != y {
                return x.cmp(&y);
            }
        }
        // a final release sorts after its pre-releases
        let pre_key = |p: Option<Pre>| match p {
            None => (1, None),
            Some(p) => (0, Some(p)),
        };
        pre_key(pa)
            .cmp(&pre_key(pb))
            .then(qa.unwrap_or(0).cmp(&qb.unwrap_or(0)))
    }
}

impl fmt::Display for PyVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (pre, post) = (self.pre, self.post);
        let r: Vec<String> = self.release.iter().map(u64::to_string).collect();
        f.write_str(&r.join("."))?;
        match pre {
            Some(Pre::Rc(n)) => write!(f, "rc{n}")?,
            Some(Pre::Alpha(n)) => write!(f, "a{n}")?,
            Some(Pre::Beta(n)) => write!(f, "b{n}")?,
            Some(Pre::Dev(n)) => write!(f, ".dev{n}")?,
            None => {}
        }
        if let Some(p) = post {
            write!(f, ".post{p}")?;
        }
        Ok(())
    }
}

/// What a version probe found for one distribution: the raw string and its parse, kept apart so
/// "not installed" and "installed but unparseable" stay distinguishable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionProbe {
    /// Distribution name.
    pub dist: &'static str,
    /// The metadata version string, None when not installed.
    pub raw: Option<String>,
}

/// The verdict of a floor check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FloorVerdict {
    /// At or above the floor.
    Ok(PyVersion),
    /// Below the floor (pre-releases of the floor included): decline.
    Below {
        /// Found.
        found: PyVersion,
        /// Required.
        floor: PyVersion,
    },
    /// Not installed: decline.
    Missing,
    /// Installed, version unparseable: defer to the plan-name check.
    Defer(String),
}

impl VersionProbe {
    /// The verdict against `floor`.
    pub fn verdict(&self, floor: &PyVersion) -> FloorVerdict {
        match &self.raw {
            None => FloorVerdict::Missing,
            Some(raw) => match PyVersion::parse(raw) {
                None => FloorVerdict::Defer(raw.clone()),
                Some(v) if &v < floor => FloorVerdict::Below {
                    found: v,
                    floor: floor.clone(),
                },
                Some(v) => FloorVerdict::Ok(v),
            },
        }
    }

    /// The reason to decline, if this probe declines.
    pub fn decline_reason(&self, floor: &PyVersion) -> Option<String> {
        match self.verdict(floor) {
            FloorVerdict::Missing => Some(format!(
                "{} is not installed (FROST needs >= {floor})",
                self.dist
            )),
            FloorVerdict::Below { found, floor } => Some(format!(
                "{} {found} is below the FROST floor {floor}",
                self.dist
            )),
            FloorVerdict::Ok(_) | FloorVerdict::Defer(_) => None,
        }
    }
}

/// What the environment probe reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrostEnv {
    /// cuDNN frontend.
    pub frontend: VersionProbe,
    /// CuTe DSL.
    pub cutlass_dsl: VersionProbe,
    /// Whether `CUDNN_FRONTEND_ENABLE_FROST_ENGINES` was set to a true value before the import.
    pub engines_enabled: bool,
    /// Python version of the embedded interpreter (empty without one).
    pub python: String,
}

impl FrostEnv {
    /// Every reason to decline from the environment (empty: go on to build and name-check).
    pub fn decline_reasons(&self) -> Vec<String> {
        let mut r = Vec::new();
        r.extend(self.frontend.decline_reason(&frontend_floor()));
        r.extend(self.cutlass_dsl.decline_reason(&cutlass_dsl_floor()));
        if !self.engines_enabled {
            r.push(format!("{ENABLE_ENV} is not enabled"));
        }
        r
    }
}

/// True for the values the frontend reads as "on".
pub fn env_flag_on(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

/// How a plan name from `graph.get_plan_name_at_index` classifies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanClass {
    /// A FROST SDPA engine (`sdpa_fwd_prefill_sm100[...]`, `sdpa_bwd_sm100_d256`, ...).
    Frost(String),
    /// A libcudnn backend plan (`eng<N>_k...`).
    Backend(String),
    /// Anything else (another Python engine, the delegating `backend_heuristics` entry).
    Other(String),
}

/// FROST SDPA row-name prefixes (forward prefill and backward families).
pub const FROST_ROW_PREFIXES: [&str; 2] = ["sdpa_fwd_prefill_sm", "sdpa_bwd_sm"];

/// Classifies a plan by its name (and engine id when known: FROST ids are >= 20000).
pub fn classify_plan(name: &str, engine_id: Option<i64>) -> PlanClass {
    let row = name.split('[').next().unwrap_or(name);
    let frost_name = FROST_ROW_PREFIXES.iter().any(|p| row.starts_with(p));
    let frost_id = engine_id.is_none_or(|id| id >= 20000);
    if frost_name && frost_id {
        PlanClass::Frost(name.to_string())
    } else if row.starts_with("eng") && row[3..].starts_with(|c: char| c.is_ascii_digit()) {
        PlanClass::Backend(name.to_string())
    } else {
        PlanClass::Other(name.to_string())
    }
}

/// Errors of the FROST executor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrostError {
    /// The executor's gate or the environment declines.
    #[error("FrostAttention declined: {0}")]
    Declined(String),
    /// The plans offered are not FROST engines: refused rather than silently run.
    #[error(
        "refused: cuDNN offered no FROST plan for this graph, only {plans}; a non-FROST plan is not run as FrostAttention{hint}"
    )]
    NotFrost {
        /// The plan names offered, in rank order.
        plans: String,
        /// Why FROST may have declined (versions), if known.
        hint: String,
    },
    /// The Python side failed.
    #[error("python: {0}")]
    Python(String),
    /// CUDA failed.
    #[error("CUDA: {0}")]
    Cuda(String),
}

/// The first FROST plan of the ranked list, or a refusal naming every plan offered.
pub fn select_frost_plan(
    names: &[(String, Option<i64>)],
    env_hint: &str,
) -> Result<usize, FrostError> {
    for (i, (n, id)) in names.iter().enumerate() {
        if matches!(classify_plan(n, *id), PlanClass::Frost(_)) {
            return Ok(i);
        }
    }
    let plans = if names.is_empty() {
        "no plan at all".to_string()
    } else {
        names
            .iter()
            .map(|(n, id)| match id {
                Some(id) => format!("'{n}' (engine {id})"),
                None => format!("'{n}'"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let hint = if env_hint.is_empty() {
        String::new()
    } else {
        format!(" ({env_hint})")
    };
    Err(FrostError::NotFrost { plans, hint })
}

/// The FROST plan-cache key: the device (type and index, so a CPU tensor cannot alias cuda:0),
/// the direction, every shape, dtype, all strides, the mask band and the scale (FROST graphs
/// bake the scale in). Deterministic is not in the key because it is always declined.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FrostKey {
    /// ("cuda", ordinal).
    pub device: (&'static str, usize),
    /// Direction.
    pub direction: Direction,
    /// b, h_q, h_kv, s_q, s_kv, d_qk, d_v.
    pub dims: [usize; 7],
    /// bf16 / fp16.
    pub dtype: DType,
    /// Strides of q, k, v, o (batch, head, seq; head dim contiguous).
    pub strides: [[usize; 3]; 4],
    /// The mask band.
    pub mask: MaskSpec,
    /// The softmax scale's bits.
    pub scale_bits: u64,
}

impl FrostKey {
    /// The key of `p` on CUDA device `ordinal`.
    pub fn of(p: &AttentionProblem, dir: Direction, ordinal: usize) -> FrostKey {
        let s = |x: crate::problem::Strides| [x.batch, x.head, x.seq];
        let l = &p.layout;
        FrostKey {
            device: ("cuda", ordinal),
            direction: dir,
            dims: [
                p.batch,
                p.heads_q,
                p.heads_kv,
                p.seqlen_q,
                p.seqlen_kv,
                p.head_dim_qk,
                p.head_dim_v,
            ],
            dtype: p.dtype,
            strides: [s(l.q), s(l.k), s(l.v), s(l.o)],
            mask: mask_of(p),
            scale_bits: p.softmax_scale.to_bits(),
        }
    }
}

/// The FROST rows' scope (PR #3527): bf16/fp16, symmetric head_dim in (256, 512] multiple of
/// 8, bshd/sbhd (any strides with a contiguous head dim), no_mask/causal/causal_bottom_right
/// and sliding windows, GQA; deterministic declined.
pub fn manifest() -> Manifest {
    Manifest {
        name: NAME.to_string(),
        device: DeviceKind::Cuda,
        min_compute_capability: Some(90),
        max_compute_capability: None,
        dtypes: vec![DType::BF16, DType::F16],
        head_dim_qk: HeadDimRange { min: 264, max: 512, multiple_of: 8 },
        head_dim_v: HeadDimRange { min: 264, max: 512, multiple_of: 8 },
        head_dim_v_may_differ: false,
        masks: vec![MaskKind::NoMask, MaskKind::CausalTopLeft, MaskKind::CausalBottomRight],
        windows: true,
        rectangular: true,
        layouts: vec![LayoutKind::Bshd, LayoutKind::Sbhd, LayoutKind::Bhsd],
        arbitrary_strides: true,
        stride_multiple_of: 8,
        gqa: true,
        max_seqlen: None,
        max_score_elements: None,
        backward: true,
        deterministic: false,
        features: crate::executor::Features::none(),
        notes: vec![
            "FROST CuTe-DSL engines via the cuDNN frontend Python package (>= 1.29.0, nvidia-cutlass-dsl >= 4.7.0)".into(),
            "the selected plan is checked by name; a non-FROST plan is refused, not run".into(),
            "SM90: forward only (sdpa_fwd_prefill_sm90); SM100/SM103: forward and backward".into(),
            "unverified on SM100/SM103 in this project (no Blackwell machine)".into(),
        ],
    }
}

/// The gate without a device: manifest, determinism, empty rows, the compute capability's
/// direction support (`cc` as major*10+minor when known).
pub fn check(p: &AttentionProblem, dir: Direction, cc: Option<u32>) -> Result<(), Unsupported> {
    manifest().admits(p)?;
    if p.deterministic {
        return Err(Unsupported::new(
            "deterministic execution declined: cuDNN has no deterministic FROST backward (PR #3527, measured on B200)",
        ));
    }
    let e = p.effective_mask();
    for row in [0, p.seqlen_q - 1] {
        let (lo, hi) = e.row_range(row);
        if lo >= hi {
            return Err(Unsupported::new(format!(
                "query row {row} has no admissible key"
            )));
        }
    }
    if let Some(cc) = cc {
        match (cc, dir) {
            (90, Direction::Forward) | (100 | 103, _) => {}
            (90, Direction::Backward) => {
                return Err(Unsupported::new(
                    "no FROST SM90 backward exists (sdpa_fwd_prefill_sm90 is forward only)",
                ));
            }
            _ => return Err(Unsupported::new(format!("no FROST SDPA row for sm_{cc}"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::MaskSpec as PMask;

    fn v(s: &str) -> PyVersion {
        PyVersion::parse(s).unwrap_or_else(|| panic!("{s}"))
    }

    #[test]
    fn pep440_ordering_puts_prereleases_below_their_release() {
        assert!(v("1.29.0rc1") < frontend_floor());
        assert!(v("1.29.0.dev3") < v("1.29.0a1"));
        assert!(v("1.29.0a1") < v("1.29.0b1"));
        assert!(v("1.29.0b2") < v("1.29.0rc1"));
        assert_eq!(v("1.29"), frontend_floor());
        assert_eq!(v("1.29.0").cmp(&frontend_floor()), Ordering::Equal);
        assert!(v("1.29.0.post1") > frontend_floor());
        assert!(v("1.29.1") > frontend_floor());
        assert!(v("v1.32.0+cu13") > frontend_floor());
        assert!(v("4.6.2") < cutlass_dsl_floor());
        assert!(v("4.7.0rc1") < cutlass_dsl_floor());
        assert!(v("4.7.1") >= cutlass_dsl_floor());
        assert!(v("4.0.0b11") < v("4.0.0"));
        assert_eq!(v("1.29.0rc1").to_string(), "1.29.0rc1");
        assert_eq!(frontend_floor().to_string(), "1.29.0");
    }

    #[test]
    fn garbage_is_not_a_version() {
        for s in ["", "abc", "1..2", "main", "1.2.x", "1.2.3-beta-gamma"] {
            assert_eq!(PyVersion::parse(s), None, "{s}");
        }
    }

    #[test]
    fn only_absence_or_a_low_version_declines_and_unparseable_defers() {
        let p = |raw: Option<&str>| VersionProbe {
            dist: FRONTEND_DIST,
            raw: raw.map(str::to_string),
        };
        assert_eq!(p(None).verdict(&frontend_floor()), FloorVerdict::Missing);
        assert!(
            p(None)
                .decline_reason(&frontend_floor())
                .unwrap()
                .contains("not installed")
        );
        assert!(matches!(
            p(Some("1.29.0rc1")).verdict(&frontend_floor()),
            FloorVerdict::Below { .. }
        ));
        assert!(
            p(Some("1.28.0"))
                .decline_reason(&frontend_floor())
                .unwrap()
                .contains("1.28.0 is below")
        );
        assert_eq!(
            p(Some("git-main")).verdict(&frontend_floor()),
            FloorVerdict::Defer("git-main".into())
        );
        assert_eq!(p(Some("git-main")).decline_reason(&frontend_floor()), None);
        assert!(matches!(
            p(Some("1.32.0")).verdict(&frontend_floor()),
            FloorVerdict::Ok(_)
        ));
        let env = FrostEnv {
            frontend: p(Some("1.32.0")),
            cutlass_dsl: VersionProbe {
                dist: CUTLASS_DSL_DIST,
                raw: Some("4.6.2".into()),
            },
            engines_enabled: true,
            python: "3.12".into(),
        };
        assert_eq!(
            env.decline_reasons(),
            vec!["nvidia-cutlass-dsl 4.6.2 is below the FROST floor 4.7.0".to_string()]
        );
        assert!(env_flag_on("ON") && env_flag_on(" 1") && !env_flag_on("0") && !env_flag_on(""));
    }

    #[test]
    fn plans_are_classified_by_name() {
        assert!(matches!(
            classify_plan(
                "sdpa_fwd_prefill_sm100[TILE_M=128, TILE_N=128]",
                Some(20501)
            ),
            PlanClass::Frost(_)
        ));
        assert!(matches!(
            classify_plan("sdpa_bwd_sm100_d256", None),
            PlanClass::Frost(_)
        ));
        assert!(matches!(
            classify_plan("sdpa_fwd_prefill_sm90", Some(20517)),
            PlanClass::Frost(_)
        ));
        assert!(matches!(
            classify_plan("eng1_k24=3", Some(1)),
            PlanClass::Backend(_)
        ));
        assert!(matches!(
            classify_plan("backend_heuristics", None),
            PlanClass::Other(_)
        ));
        // a FROST-looking name with a backend engine id is not trusted
        assert!(matches!(
            classify_plan("sdpa_fwd_prefill_sm90", Some(8)),
            PlanClass::Other(_)
        ));
    }

    #[test]
    fn selection_refuses_a_backend_fallback_and_names_it() {
        let names = vec![
            ("eng1_k24=3".to_string(), Some(1)),
            ("eng0".to_string(), Some(0)),
        ];
        let e = select_frost_plan(&names, "nvidia-cutlass-dsl is not installed").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("'eng1_k24=3' (engine 1)") && msg.contains("'eng0'"),
            "{msg}"
        );
        assert!(msg.contains("cutlass-dsl"), "{msg}");
        let names = vec![
            ("eng1_k24=3".to_string(), Some(1)),
            ("sdpa_fwd_prefill_sm90".to_string(), Some(20517)),
        ];
        assert_eq!(select_frost_plan(&names, ""), Ok(1));
        assert!(
            select_frost_plan(&[], "")
                .unwrap_err()
                .to_string()
                .contains("no plan at all")
        );
    }

    #[test]
    fn cache_key_includes_device_and_layout() {
        let p = AttentionProblem::new(2, 8, 4, 256, 256, 512, 512, DType::BF16)
            .with_mask(PMask::CAUSAL_TOP_LEFT);
        let a = FrostKey::of(&p, Direction::Forward, 0);
        assert_ne!(a, FrostKey::of(&p, Direction::Forward, 1));
        assert_ne!(a, FrostKey::of(&p, Direction::Backward, 0));
        assert_ne!(
            a,
            FrostKey::of(
                &p.clone().with_layout(LayoutKind::Sbhd),
                Direction::Forward,
                0
            )
        );
        assert_ne!(
            a,
            FrostKey::of(
                &p.clone().with_mask(PMask::CAUSAL_BOTTOM_RIGHT).tap_rect(),
                Direction::Forward,
                0
            )
        );
        assert_eq!(a, FrostKey::of(&p.clone(), Direction::Forward, 0));
        assert_eq!(a.device, ("cuda", 0));
    }

    trait TapRect {
        fn tap_rect(self) -> Self;
    }
    impl TapRect for AttentionProblem {
        fn tap_rect(mut self) -> Self {
            self.seqlen_kv = 512;
            self.set_layout(LayoutKind::Bshd);
            self
        }
    }

    #[test]
    fn gate_follows_the_pull_request_scope() {
        let mut p = AttentionProblem::new(2, 8, 4, 256, 256, 512, 512, DType::BF16);
        assert!(
            check(&p, Direction::Forward, Some(90))
                .unwrap_err()
                .reason
                .contains("deterministic")
        );
        p.deterministic = false;
        assert!(check(&p, Direction::Forward, Some(90)).is_ok());
        assert!(
            check(&p, Direction::Backward, Some(90))
                .unwrap_err()
                .reason
                .contains("SM90 backward")
        );
        assert!(check(&p, Direction::Backward, Some(100)).is_ok());
        assert!(check(&p, Direction::Forward, Some(80)).is_err());
        let mut small = AttentionProblem::new(2, 8, 4, 256, 256, 256, 256, DType::BF16);
        small.deterministic = false;
        assert!(
            check(&small, Direction::Forward, None)
                .unwrap_err()
                .reason
                .contains("head_dim_qk 256")
        );
        let mut odd = AttentionProblem::new(2, 8, 4, 256, 256, 260, 260, DType::BF16);
        odd.deterministic = false;
        assert!(check(&odd, Direction::Forward, None).is_err());
    }
}

//! The `frost` executor (FrostAttention): cuDNN frontend's CuTe-DSL ("FROST") SDPA engines,
//! reached through the frontend's Python package (>= 1.29.0, with nvidia-cutlass-dsl >= 4.7.0);
//! the C API cannot reach them. The bridge (`bridge.rs`, feature `frost`) embeds CPython with
//! PyO3. `rules.rs` holds the rules of TransformerEngine PR #3527 as pure, CPU-tested Rust
//! (re-exported here); the bridge and its stand-in (`disabled.rs`) build on them.
//!
//! See `docs/cudnn.md` for what is verified on the H200 and what remains unverified on SM100/SM103.

mod rules;
pub use rules::{
    CUTLASS_DSL_DIST, ENABLE_ENV, FRONTEND_DIST, FROST_ROW_PREFIXES, FloorVerdict, FrostEnv,
    FrostError, FrostKey, NAME, PlanClass, Pre, PyVersion, VersionProbe, check, classify_plan,
    cutlass_dsl_floor, env_flag_on, frontend_floor, manifest, select_frost_plan,
};

#[cfg(feature = "frost")]
pub mod bridge;
#[cfg(feature = "frost")]
use bridge as runtime;

#[cfg(not(feature = "frost"))]
mod disabled;
#[cfg(not(feature = "frost"))]
use disabled as runtime;

pub use runtime::{availability, create};

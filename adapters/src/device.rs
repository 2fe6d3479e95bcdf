//! What every executor asks about the machine: how many CUDA devices there are
//! ([`cuda_devices`]), what one of them is ([`device_identity`]), and the answer an executor
//! gives to "can it run here?" ([`Availability`]).
//!
//! Every executor imports this module and it imports none of them, so the executors do not
//! reach into each other (or into the registry) for CUDA discovery; `tests/architecture.rs`
//! fails on any circle of files. CUDA is loaded at run time (cudarc dynamic loading, feature
//! `cuda`); without the feature every answer says why there is no device.

use serde::{Deserialize, Serialize};

/// Whether an executor can run here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "availability", rename_all = "snake_case")]
pub enum Availability {
    /// It can run (the detail says on what).
    Available {
        /// What was found (device, library version).
        detail: String,
    },
    /// It cannot run here.
    Unavailable {
        /// Why: no GPU, feature off, library missing, provided by the Python host.
        reason: String,
    },
}

impl Availability {
    /// Shorthand for [`Availability::Unavailable`].
    pub fn unavailable(reason: impl Into<String>) -> Availability {
        Availability::Unavailable {
            reason: reason.into(),
        }
    }
    /// Is it available?
    pub fn is_available(&self) -> bool {
        matches!(self, Availability::Available { .. })
    }
    /// The reason it is unavailable, if it is.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Availability::Available { .. } => None,
            Availability::Unavailable { reason } => Some(reason),
        }
    }
}

/// Number of CUDA devices, or why none can be used (driver library missing, `cuInit` failed,
/// no device). Cached: the answer does not change within a process.
#[cfg(feature = "cuda")]
pub fn cuda_devices() -> Result<usize, String> {
    use cudarc::driver::{result as drv_result, sys as drv_sys};
    static N: std::sync::OnceLock<Result<usize, String>> = std::sync::OnceLock::new();
    N.get_or_init(|| {
        // SAFETY: dlopen probe only.
        if !unsafe { drv_sys::is_culib_present() } {
            return Err("no GPU: the CUDA driver library (libcuda) is not present".into());
        }
        drv_result::init().map_err(|e| format!("no GPU: cuInit failed: {e:?}"))?;
        let n = drv_result::device::get_count().map_err(|e| format!("no GPU: {e:?}"))?;
        if n <= 0 {
            return Err("no GPU: the CUDA driver reports no device".into());
        }
        Ok(n as usize)
    })
    .clone()
}

/// Name and compute capability (major, minor) of CUDA device `ordinal`, read from the driver
/// (the live device facts `attn-policy run` decides with), or why there is none.
#[cfg(feature = "cuda")]
pub fn device_identity(ordinal: usize) -> Result<(String, (u32, u32)), String> {
    let n = cuda_devices()?;
    if ordinal >= n {
        return Err(format!("no CUDA device {ordinal} ({n} device(s))"));
    }
    let ctx = cudarc::driver::CudaContext::new(ordinal)
        .map_err(|e| format!("CUDA device {ordinal}: {e:?}"))?;
    let name = ctx
        .name()
        .map_err(|e| format!("CUDA device {ordinal}: {e:?}"))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| format!("CUDA device {ordinal}: {e:?}"))?;
    Ok((name, (major as u32, minor as u32)))
}

/// Why there is no CUDA device in a build without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
const NO_CUDA: &str = "attn-policy-adapters was built without the `cuda` feature";

/// Number of CUDA devices: none can be used in this build.
#[cfg(not(feature = "cuda"))]
pub fn cuda_devices() -> Result<usize, String> {
    Err(NO_CUDA.into())
}

/// No CUDA device can be read in this build.
#[cfg(not(feature = "cuda"))]
pub fn device_identity(_ordinal: usize) -> Result<(String, (u32, u32)), String> {
    Err(NO_CUDA.into())
}

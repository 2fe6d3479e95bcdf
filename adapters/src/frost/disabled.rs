//! Stand-in for the FROST bridge when the crate is built without the `frost` feature: the same
//! registry functions as `bridge.rs`, each saying why nothing can run.

use std::sync::Arc;

use crate::device::Availability;
use crate::executor::{ExecError, Executor};

const WHY: &str = "attn-policy-adapters was built without the `frost` feature";

/// Registry constructor: always [`ExecError::NoDevice`] in this build.
pub fn create(_ordinal: usize) -> Result<Arc<dyn Executor>, ExecError> {
    Err(ExecError::NoDevice { reason: WHY.into() })
}

/// Always unavailable in this build.
pub fn availability() -> Availability {
    Availability::unavailable(WHY)
}

//! The C ABI the C++ autograd node calls (`attn_policy/csrc/eager_node.cpp`).
//!
//! Why it exists: a backward written in Python runs on autograd's device thread under the
//! GIL, which costs more per call than SDPA's whole eager forward + backward (issue 14's
//! overhead target). The C++ node is compiled against the user's torch on first use
//! (`attn_policy/_eager_node.py`); it reaches the plans through this table of plain C
//! functions, never through Python, so its backward takes no GIL.
//!
//! The table's address comes from `plan_abi()` and a plan's from `NativePlan.handle`. Every
//! function catches panics; a failure returns a nonzero status (its kind, see `Status`) and
//! leaves the message in a thread-local buffer that `last_error` returns.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use attn_policy_adapters::{DType, DeviceBackwardArgs, DeviceForwardArgs, ExecError};
use pyo3::prelude::*;

use crate::torch_ops::PlanCore;

/// Bumped when the table or a signature changes; the C++ node refuses another version.
pub const ABI_VERSION: u32 = 2;

/// A call's outcome; the C++ node prefixes the message with the Python exception's name.
#[repr(i32)]
enum Status {
    Ok = 0,
    /// `ExecutorRefused`: the executor does not run this problem.
    Refused = 1,
    /// `ExecutorUnavailable`: it cannot run in this process.
    Unavailable = 2,
    /// `InvalidInput`: the tensors do not describe the problem (or reach past their storage).
    InvalidInput = 3,
    /// `ExecutorFailed`: a library call failed (or a bug panicked).
    Failed = 4,
}

/// What the node needs to allocate a forward's outputs.
#[repr(C)]
pub struct PlanInfo {
    /// LSE shape `[batch, heads_q, seqlen_q]` (a packed batch: `[1, heads_q, total query
    /// tokens]`).
    pub batch: i64,
    pub heads_q: i64,
    pub seqlen_q: i64,
    /// 1: the LSE is float64 (float64 problems); 0: float32.
    pub lse_f64: i32,
    /// 1: the plan computes on the host (CPU tensors).
    pub on_host: i32,
    /// Forward workspace bytes.
    pub workspace_forward: u64,
}

/// The table the C++ node receives (field order and types are the ABI).
#[repr(C)]
pub struct PlanAbi {
    pub version: u32,
    pub retain: unsafe extern "C" fn(*const PlanCore),
    pub release: unsafe extern "C" fn(*const PlanCore),
    pub info: unsafe extern "C" fn(*const PlanCore, *mut PlanInfo),
    pub workspace_backward: unsafe extern "C" fn(*const PlanCore, *mut u64) -> i32,
    /// `ptrs`: Q, K, V, O, LSE; `avail`: the bytes each one's storage holds from its pointer.
    pub forward:
        unsafe extern "C" fn(*const PlanCore, *const u64, *const u64, u64, u64, u64) -> i32,
    /// `ptrs` (and `avail`): Q, K, V, O, dO, LSE, dQ, dK, dV.
    pub backward:
        unsafe extern "C" fn(*const PlanCore, *const u64, *const u64, u64, u64, u64) -> i32,
    pub last_error: unsafe extern "C" fn() -> *const c_char,
}

static ABI: PlanAbi = PlanAbi {
    version: ABI_VERSION,
    retain,
    release,
    info,
    workspace_backward,
    forward,
    backward,
    last_error,
};

/// The table's address.
pub fn address() -> usize {
    &ABI as *const PlanAbi as usize
}

/// The C ABI table of plans for the C++ autograd node: `(address, version)`.
#[pyfunction]
pub fn plan_abi() -> (usize, u32) {
    (address(), ABI_VERSION)
}

/// Registers `plan_abi` on the module (this module names the plans' module, `torch_ops`, which
/// names nothing here: no circle of files).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(plan_abi, m)?)?;
    Ok(())
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn fail(status: Status, message: String) -> i32 {
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = message);
    status as i32
}

/// Runs `f`, turning its error or panic into a status and a message.
fn guarded(f: impl FnOnce() -> Result<(), ExecError>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => Status::Ok as i32,
        Ok(Err(e)) => {
            let status = match &e {
                ExecError::Unsupported { .. } => Status::Refused,
                ExecError::NoDevice { .. } | ExecError::Unavailable { .. } => Status::Unavailable,
                ExecError::InvalidInput { .. } => Status::InvalidInput,
                _ => Status::Failed,
            };
            let message = match e {
                ExecError::Unsupported { reason }
                | ExecError::NoDevice { reason }
                | ExecError::Unavailable { reason, .. }
                | ExecError::InvalidInput { reason } => reason,
                other => other.to_string(),
            };
            fail(status, message)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            fail(Status::Failed, format!("internal error (panic): {what}"))
        }
    }
}

/// # Safety
/// `plan` is a `NativePlan.handle` whose plan is alive.
unsafe extern "C" fn retain(plan: *const PlanCore) {
    // SAFETY: the handle is `Arc::as_ptr` of a live plan.
    unsafe { Arc::increment_strong_count(plan) }
}

/// # Safety
/// `plan` was retained by the caller.
unsafe extern "C" fn release(plan: *const PlanCore) {
    // SAFETY: pairs with the caller's `retain`.
    unsafe { Arc::decrement_strong_count(plan) }
}

/// # Safety
/// `plan` is live; `out` is writable.
unsafe extern "C" fn info(plan: *const PlanCore, out: *mut PlanInfo) {
    // SAFETY: the caller's contract.
    let (plan, out) = unsafe { (&*plan, &mut *out) };
    let p = &plan.p;
    *out = PlanInfo {
        batch: p.batch_dim() as i64,
        heads_q: p.heads_q as i64,
        seqlen_q: p.rows_q() as i64,
        lse_f64: i32::from(p.dtype == DType::F64),
        on_host: i32::from(plan.device.is_none()),
        workspace_forward: plan.ws_forward,
    };
}

/// # Safety
/// `plan` is live; `bytes` is writable.
unsafe extern "C" fn workspace_backward(plan: *const PlanCore, bytes: *mut u64) -> i32 {
    guarded(|| {
        // SAFETY: the caller's contract.
        let (plan, bytes) = unsafe { (&*plan, &mut *bytes) };
        *bytes = plan.workspace_backward()?;
        Ok(())
    })
}

/// # Safety
/// `plan` is live; `ptrs` holds 5 pointers to tensors as `PlanCore::forward` requires and
/// `avail` 5 byte counts (checked against the problem there).
unsafe extern "C" fn forward(
    plan: *const PlanCore,
    ptrs: *const u64,
    avail: *const u64,
    workspace: u64,
    workspace_bytes: u64,
    stream: u64,
) -> i32 {
    guarded(|| {
        // SAFETY: the caller's contract.
        let (plan, p, avail) = unsafe {
            (
                &*plan,
                &*ptrs.cast::<[u64; 5]>(),
                &*avail.cast::<[u64; 5]>(),
            )
        };
        let args = DeviceForwardArgs {
            q: p[0],
            k: p[1],
            v: p[2],
            o: p[3],
            lse: p[4],
            sink: 0,
        };
        // SAFETY: the caller's contract. The node passes no sink (a learnable plan is refused
        // there as InvalidInput: its logits are a Python-side input).
        unsafe { plan.forward(&args, avail, 0, workspace, workspace_bytes, stream) }
    })
}

/// # Safety
/// `plan` is live; `ptrs` holds 9 pointers to tensors as `PlanCore::backward` requires and
/// `avail` 9 byte counts.
unsafe extern "C" fn backward(
    plan: *const PlanCore,
    ptrs: *const u64,
    avail: *const u64,
    workspace: u64,
    workspace_bytes: u64,
    stream: u64,
) -> i32 {
    guarded(|| {
        // SAFETY: the caller's contract.
        let (plan, p, avail) = unsafe {
            (
                &*plan,
                &*ptrs.cast::<[u64; 9]>(),
                &*avail.cast::<[u64; 9]>(),
            )
        };
        let args = DeviceBackwardArgs {
            q: p[0],
            k: p[1],
            v: p[2],
            o: p[3],
            d_o: p[4],
            lse: p[5],
            dq: p[6],
            dk: p[7],
            dv: p[8],
            sink: 0,
            d_sink: 0,
        };
        // SAFETY: the caller's contract (no sink, as in `forward`).
        unsafe { plan.backward(&args, avail, (0, 0), workspace, workspace_bytes, stream) }
    })
}

/// The message of this thread's last failed call (valid until its next call).
unsafe extern "C" fn last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

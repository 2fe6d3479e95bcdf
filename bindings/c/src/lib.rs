//! C ABI for attn-policy: load a pack, select from a JSON config, read the decision JSON and
//! the selected backend. Opaque handles, JSON strings, status codes; no panic crosses the
//! boundary (every entry point runs under `catch_unwind` and reports a panic as
//! `ATTN_POLICY_PANIC` with its message). The header is `include/attn_policy.h` (cbindgen;
//! a test regenerates it and fails when the committed copy differs).
//!
//! Strings returned through `out`/`error` parameters are owned by the caller and freed with
//! `attn_policy_string_free`. Handles are thread-safe: many threads may select on one policy.
//!
//! Every entry point takes raw pointers, so each is `unsafe` with a `# Safety` section saying
//! what the caller must guarantee; each `unsafe` block inside says, in a `SAFETY:` comment, why
//! that guarantee (or a null check just before it) makes the operation sound.

#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

use std::ffi::{CStr, CString, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::Arc;

use attn_policy::CachedPolicy;
use attn_policy::Decision;
use attn_policy::facts::ConfigText;
use attn_policy::{Explanation, Facts, PackSpec};

/// Success.
pub const ATTN_POLICY_OK: c_int = 0;
/// A null pointer or a string that is not UTF-8.
pub const ATTN_POLICY_INVALID_ARGUMENT: c_int = 1;
/// The pack failed to load (the message holds every diagnostic).
pub const ATTN_POLICY_PACK_ERROR: c_int = 2;
/// The config is not a valid fact set (the message is the CLI's).
pub const ATTN_POLICY_CONFIG_ERROR: c_int = 3;
/// A panic inside the library, caught at the boundary.
pub const ATTN_POLICY_PANIC: c_int = 4;

/// A loaded pack with its decision cache.
pub struct AttnPolicy {
    inner: CachedPolicy,
    /// Backend names as C strings, for `attn_policy_decision_selected`.
    names: Vec<CString>,
}

/// One decision, with the facts that produced it.
pub struct AttnDecision {
    policy: *const AttnPolicy,
    facts: Facts,
    decision: Arc<Decision>,
}

/// Version of this ABI (bumped on any incompatible change).
#[unsafe(no_mangle)]
pub extern "C" fn attn_policy_abi_version() -> u32 {
    1
}

fn to_c(s: String) -> *mut c_char {
    CString::new(s.replace('\0', " "))
        .map(CString::into_raw)
        .unwrap_or(ptr::null_mut())
}

/// Stores `message` in `*error` unless `error` is NULL.
///
/// # Safety
/// `error` is NULL or valid for a write of one pointer.
unsafe fn set_error(error: *mut *mut c_char, message: String) {
    if !error.is_null() {
        // SAFETY: non-null, and valid for writes by this function's contract.
        unsafe { *error = to_c(message) };
    }
}

/// Borrows a C string argument as UTF-8, or the status and message for a NULL or non-UTF-8 one.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid and unchanged for `'a`.
unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, (c_int, String)> {
    if p.is_null() {
        return Err((ATTN_POLICY_INVALID_ARGUMENT, format!("{what} is NULL")));
    }
    // SAFETY: non-null, NUL-terminated and live for 'a by this function's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| (ATTN_POLICY_INVALID_ARGUMENT, format!("{what} is not UTF-8")))
}

/// Runs `f`, turning an error or a panic into a status code and `*error`.
///
/// # Safety
/// `error` is NULL or valid for a write of one pointer.
unsafe fn guard(error: *mut *mut c_char, f: impl FnOnce() -> Result<(), (c_int, String)>) -> c_int {
    if !error.is_null() {
        // SAFETY: non-null, and valid for writes by this function's contract.
        unsafe { *error = ptr::null_mut() };
    }
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => ATTN_POLICY_OK,
        Ok(Err((code, msg))) => {
            // SAFETY: `error` is as this function's contract requires.
            unsafe { set_error(error, msg) };
            code
        }
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            // SAFETY: `error` is as this function's contract requires.
            unsafe { set_error(error, format!("internal error (panic): {msg}")) };
            ATTN_POLICY_PANIC
        }
    }
}

/// Loads a pack: `pack` names an embedded pack (`"te"`) unless `dir` (a folder holding
/// pack.yaml) is non-NULL. `parity` non-zero switches off the `guard` layer. `cache_size`
/// bounds the decision cache. On success `*out` is a new handle (free with
/// `attn_policy_free`).
///
/// # Safety
/// `pack` and `dir` are NULL or NUL-terminated UTF-8 strings; `out` is valid for a write of
/// one pointer; `error` is NULL or valid for a write of one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn attn_policy_load(
    pack: *const c_char,
    dir: *const c_char,
    parity: c_int,
    cache_size: usize,
    out: *mut *mut AttnPolicy,
    error: *mut *mut c_char,
) -> c_int {
    // SAFETY: `error`, `pack`, `dir` and `out` are as this function's contract requires;
    // `out` is written only after its null check.
    unsafe {
        guard(error, || {
            if out.is_null() {
                return Err((ATTN_POLICY_INVALID_ARGUMENT, "out is NULL".into()));
            }
            *out = ptr::null_mut();
            let spec = if !dir.is_null() {
                PackSpec::dir(str_arg(dir, "dir")?)
            } else {
                let name = if pack.is_null() {
                    "te"
                } else {
                    str_arg(pack, "pack")?
                };
                PackSpec::embedded(name)
            };
            // With the executor catalogue (manifests only: nothing here opens a device), so a
            // decision reports the chain that would run it, as the CLI and Python do.
            let policy = spec
                .with_parity(parity != 0)
                .with_catalogue(std::sync::Arc::new(
                    attn_policy_adapters::catalogue::catalogue(),
                ))
                .load()
                .map_err(|e| (ATTN_POLICY_PACK_ERROR, e.render(false)))?;
            let names = policy
                .backends
                .iter()
                .map(|b| CString::new(b.name.replace('\0', " ")).unwrap_or_default())
                .collect();
            *out = Box::into_raw(Box::new(AttnPolicy {
                inner: CachedPolicy::new(policy, cache_size),
                names,
            }));
            Ok(())
        })
    }
}

/// Frees a policy handle (NULL is ignored). Free its decisions first.
///
/// # Safety
/// `policy` is NULL or a handle from `attn_policy_load` not freed before, with no decision of
/// it still alive and no other thread using it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn attn_policy_free(policy: *mut AttnPolicy) {
    if !policy.is_null() {
        // SAFETY: a live handle made by Box::into_raw in attn_policy_load, freed once.
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(policy) })));
    }
}

/// Decides for a JSON config (an object of facts by TE's names). On success `*out` is a new
/// decision (free with `attn_policy_decision_free`; it must not outlive the policy).
///
/// # Safety
/// `policy` is NULL or a live handle from `attn_policy_load`; `config_json` is NULL or a
/// NUL-terminated string; `out` is NULL or valid for a write of one pointer; `error` is NULL or
/// valid for a write of one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn attn_policy_select(
    policy: *const AttnPolicy,
    config_json: *const c_char,
    out: *mut *mut AttnDecision,
    error: *mut *mut c_char,
) -> c_int {
    // SAFETY: the pointers are as this function's contract requires; `policy` is read and
    // `out` written only after their null checks.
    unsafe {
        guard(error, || {
            if policy.is_null() || out.is_null() {
                return Err((ATTN_POLICY_INVALID_ARGUMENT, "policy or out is NULL".into()));
            }
            *out = ptr::null_mut();
            let text = str_arg(config_json, "config_json")?;
            // Read with key positions: an error names `config_json:line:col` (a key given
            // twice, a value outside its domain) like the command line does.
            let facts = ConfigText::json("config_json", text)
                .and_then(|t| t.read((*policy).inner.policy().schema))
                .map_err(|e| (ATTN_POLICY_CONFIG_ERROR, format!("invalid config: {e}")))?;
            let decision = (*policy).inner.decide(&facts);
            *out = Box::into_raw(Box::new(AttnDecision {
                policy,
                facts,
                decision,
            }));
            Ok(())
        })
    }
}

/// Frees a decision (NULL is ignored).
///
/// # Safety
/// `decision` is NULL or a decision from `attn_policy_select` not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn attn_policy_decision_free(decision: *mut AttnDecision) {
    if !decision.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: a live decision made by Box::into_raw in attn_policy_select, freed once.
            drop(unsafe { Box::from_raw(decision) })
        }));
    }
}

/// Which rendering `attn_policy_decision_render` produces.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnPolicyFormat {
    /// The `attn-policy/explain/v1` JSON document (`attn-policy explain --json`).
    Json = 0,
    /// The human text (`attn-policy explain`).
    Text = 1,
    /// TransformerEngine's return tuple as a JSON object (`--format te`).
    Te = 2,
}

/// Renders a decision into `*out` (free with `attn_policy_string_free`).
///
/// # Safety
/// `decision` is NULL or a live decision whose policy is still alive; `out` is NULL or valid
/// for a write of one pointer; `error` is NULL or valid for a write of one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn attn_policy_decision_render(
    decision: *const AttnDecision,
    format: AttnPolicyFormat,
    out: *mut *mut c_char,
    error: *mut *mut c_char,
) -> c_int {
    // SAFETY: the pointers are as this function's contract requires; `decision` is read and
    // `out` written only after their null checks, and a decision never outlives its policy.
    unsafe {
        guard(error, || {
            if decision.is_null() || out.is_null() {
                return Err((
                    ATTN_POLICY_INVALID_ARGUMENT,
                    "decision or out is NULL".into(),
                ));
            }
            let d = &*decision;
            let policy = (*d.policy).inner.policy();
            // The C caller hands over JSON only: no provenance is known here. The ABI selects
            // but runs nothing: the chain the decision would walk, every entry `not_tried`.
            let ex = Explanation::new(policy, &d.facts, &d.decision).with_unwalked_chain(
                policy,
                &d.facts,
                &d.decision,
                "the C ABI selects; it runs no executor",
            );
            let s = match format {
                AttnPolicyFormat::Json => ex.to_json_string(false),
                AttnPolicyFormat::Text => ex.to_text(false),
                AttnPolicyFormat::Te => ex.to_te().to_string(),
            };
            *out = to_c(s);
            Ok(())
        })
    }
}

/// The selected backend's name (owned by the policy, valid until `attn_policy_free`; do not free),
/// or NULL when no backend can serve the configuration.
///
/// # Safety
/// `decision` is NULL or a live decision whose policy is still alive.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn attn_policy_decision_selected(
    decision: *const AttnDecision,
) -> *const c_char {
    if decision.is_null() {
        return ptr::null();
    }
    // SAFETY: non-null and live by this function's contract; its policy outlives it, and
    // `selected` indexes the policy's backends, for which `names` has one entry each.
    catch_unwind(AssertUnwindSafe(|| unsafe {
        let d = &*decision;
        match d.decision.selected {
            Some(s) => (&(*d.policy).names)[s as usize].as_ptr(),
            None => ptr::null(),
        }
    }))
    .unwrap_or(ptr::null())
}

/// Cache counters (any pointer may be NULL).
///
/// # Safety
/// `policy` is NULL or a live handle from `attn_policy_load`; each counter pointer is NULL or
/// valid for a write of one `u64`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn attn_policy_cache_stats(
    policy: *const AttnPolicy,
    hits: *mut u64,
    misses: *mut u64,
    evictions: *mut u64,
) -> c_int {
    if policy.is_null() {
        return ATTN_POLICY_INVALID_ARGUMENT;
    }
    // SAFETY: non-null and live by this function's contract.
    let s = unsafe { (*policy).inner.cache().stats() };
    // SAFETY: each pointer is written only when non-null, and then valid by the contract.
    unsafe {
        if !hits.is_null() {
            *hits = s.hits;
        }
        if !misses.is_null() {
            *misses = s.misses;
        }
        if !evictions.is_null() {
            *evictions = s.evictions;
        }
    }
    ATTN_POLICY_OK
}

/// Frees a string returned by this library (NULL is ignored).
///
/// # Safety
/// `s` is NULL or a string this library returned through `out` or `error`, not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn attn_policy_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: made by CString::into_raw in `to_c`, freed once, by this function's contract.
        drop(unsafe { CString::from_raw(s) });
    }
}

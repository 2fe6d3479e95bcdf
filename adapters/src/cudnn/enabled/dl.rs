//! The libcudnn the executor calls, loaded once per process.
//!
//! Inside a framework's process (PyTorch loads its own libcudnn when it is imported) the
//! executor must call that same library: two cuDNN builds in one process would disagree on
//! versions, plans and handles. So the choice is, in order:
//! 1. the `libcudnn.so[.N]` already mapped into the process (read from `/proc/self/maps`),
//! 2. the path in `ATTN_POLICY_CUDNN_LIBRARY`,
//! 3. the names cudarc tries (`libcudnn.so`, ..., `libcudnn.so.9`) on the loader's search path.
//!
//! Only the few entry points the executor calls are resolved (the backend graph API, handles,
//! streams, the version and the last error string); the types come from cudarc's bindings.

use std::ffi::{c_char, c_void};
use std::sync::OnceLock;

use super::super::libpath::loaded_in_process;
use cudarc::cudnn::sys::{
    cudaStream_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
    cudnnBackendDescriptor_t, cudnnBackendDescriptorType_t, cudnnHandle_t, cudnnStatus_t,
};

/// Environment variable naming a libcudnn to load when the process has none loaded yet.
pub const LIBRARY_ENV: &str = "ATTN_POLICY_CUDNN_LIBRARY";

/// How the library was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Already loaded in the process (a framework's).
    Process,
    /// [`LIBRARY_ENV`].
    Env,
    /// The loader's search path.
    SearchPath,
}

impl Origin {
    /// A few words for descriptions.
    pub fn describe(self) -> &'static str {
        match self {
            Origin::Process => "already loaded in this process",
            Origin::Env => LIBRARY_ENV,
            Origin::SearchPath => "found on the library search path",
        }
    }
}

/// The resolved entry points of one libcudnn.
pub struct Api {
    _lib: libloading::Library,
    /// What was loaded (a path or a library name).
    pub path: String,
    /// How it was chosen.
    pub origin: Origin,
    pub(crate) create: unsafe extern "C" fn(*mut cudnnHandle_t) -> cudnnStatus_t,
    pub(crate) destroy: unsafe extern "C" fn(cudnnHandle_t) -> cudnnStatus_t,
    pub(crate) set_stream: unsafe extern "C" fn(cudnnHandle_t, cudaStream_t) -> cudnnStatus_t,
    pub(crate) get_version: unsafe extern "C" fn() -> usize,
    pub(crate) last_error: unsafe extern "C" fn(*mut c_char, usize),
    pub(crate) create_desc: unsafe extern "C" fn(
        cudnnBackendDescriptorType_t,
        *mut cudnnBackendDescriptor_t,
    ) -> cudnnStatus_t,
    pub(crate) destroy_desc: unsafe extern "C" fn(cudnnBackendDescriptor_t) -> cudnnStatus_t,
    pub(crate) finalize: unsafe extern "C" fn(cudnnBackendDescriptor_t) -> cudnnStatus_t,
    pub(crate) set_attr: unsafe extern "C" fn(
        cudnnBackendDescriptor_t,
        cudnnBackendAttributeName_t,
        cudnnBackendAttributeType_t,
        i64,
        *const c_void,
    ) -> cudnnStatus_t,
    pub(crate) get_attr: unsafe extern "C" fn(
        cudnnBackendDescriptor_t,
        cudnnBackendAttributeName_t,
        cudnnBackendAttributeType_t,
        i64,
        *mut i64,
        *mut c_void,
    ) -> cudnnStatus_t,
    pub(crate) execute: unsafe extern "C" fn(
        cudnnHandle_t,
        cudnnBackendDescriptor_t,
        cudnnBackendDescriptor_t,
    ) -> cudnnStatus_t,
}

fn candidates() -> Vec<(String, Origin)> {
    let mut c = Vec::new();
    if let Some(p) = loaded_in_process() {
        c.push((p, Origin::Process));
    }
    if let Some(p) = std::env::var_os(LIBRARY_ENV) {
        c.push((p.to_string_lossy().into_owned(), Origin::Env));
    }
    c.extend(
        cudarc::get_lib_name_candidates("cudnn")
            .into_iter()
            .map(|n| (n, Origin::SearchPath)),
    );
    c
}

fn open(path: &str, origin: Origin) -> Result<Api, String> {
    // SAFETY: loading libcudnn runs its initialisers, which have no preconditions.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol's C signature is the field's type (cudnn.h, as cudarc binds it).
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{path}: {}: {e}", $name))?
        };
    }
    Ok(Api {
        path: path.to_string(),
        origin,
        create: sym!("cudnnCreate"),
        destroy: sym!("cudnnDestroy"),
        set_stream: sym!("cudnnSetStream"),
        get_version: sym!("cudnnGetVersion"),
        last_error: sym!("cudnnGetLastErrorString"),
        create_desc: sym!("cudnnBackendCreateDescriptor"),
        destroy_desc: sym!("cudnnBackendDestroyDescriptor"),
        finalize: sym!("cudnnBackendFinalize"),
        set_attr: sym!("cudnnBackendSetAttribute"),
        get_attr: sym!("cudnnBackendGetAttribute"),
        execute: sym!("cudnnBackendExecute"),
        _lib: lib,
    })
}

/// The process's libcudnn entry points (loaded on first use), or why none could be loaded.
pub fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        let mut errors = Vec::new();
        for (path, origin) in candidates() {
            match open(&path, origin) {
                Ok(api) => return Ok(api),
                // Names that are simply absent are not worth listing one by one.
                Err(e) if origin == Origin::SearchPath => errors.push(e),
                Err(e) => return Err(format!("{} ({}): {e}", path, origin.describe())),
            }
        }
        Err(format!(
            "libcudnn not found (no libcudnn loaded in this process, {LIBRARY_ENV} unset, none on the library search path; {} names tried)",
            errors.len()
        ))
    })
    .as_ref()
    .map_err(Clone::clone)
}

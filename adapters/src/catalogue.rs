//! The executor catalogue this crate gives the pack loader: every executor a chain may name,
//! as data (see `attn_policy::catalogue`). Executors the Python host provides (`torch_*`) are
//! listed too, so a pack naming them loads everywhere; outside Python they are unavailable.

use attn_policy::{CatalogueEntry, ExecutorCatalogue, Provider};

use crate::executor::Manifest;

/// Executors provided by the Python package (torch's own SDPA kernels), by name. Their
/// manifests live with the Python host, so the catalogue states no `admits` condition for them
/// and `check` makes no claim about their chain entries.
pub const HOST_EXECUTORS: &[(&str, &str)] = &[
    (
        "torch_flash",
        "PyTorch's FlashAttention-2 kernel (inside Python only)",
    ),
    (
        "torch_efficient",
        "PyTorch's memory-efficient (xFormers) kernel (inside Python only)",
    ),
    (
        "torch_cudnn",
        "PyTorch's cuDNN attention kernel (inside Python only)",
    ),
    (
        "torch_math",
        "PyTorch's math reference path (inside Python only)",
    ),
];

/// This crate's executors (each behind its cargo feature and a run-time probe: listed in every
/// build, available where they can run).
/// A built-in executor: name, description, manifest.
pub type BuiltinExecutor = (&'static str, &'static str, fn() -> Manifest);

pub const BUILTIN_EXECUTORS: &[BuiltinExecutor] = &[
    (
        crate::reference::NAME,
        "CPU float64 reference (oracle), every shape/mask/window/GQA",
        crate::reference::manifest,
    ),
    (
        crate::chunked::NAME,
        "CUDA chunked cuBLAS GEMMs + NVRTC softmax, any head_dim (multiple of 8)",
        crate::chunked::manifest,
    ),
    (
        crate::cudnn::NAME,
        "cuDNN fused attention through the backend graph API",
        crate::cudnn::manifest,
    ),
    (
        crate::frost::NAME,
        "cuDNN FROST kernels (head_dim 256 < d <= 512 on SM100/SM103) via cuDNN frontend",
        crate::frost::manifest,
    ),
];

/// The catalogue of this build: the crate's executors and the Python host's.
pub fn catalogue() -> ExecutorCatalogue {
    let mut c = ExecutorCatalogue::new();
    for (name, description, manifest) in BUILTIN_EXECUTORS {
        c.add(CatalogueEntry {
            name: name.to_string(),
            description: description.to_string(),
            provider: Provider::Builtin,
            admits: vec![("te".into(), crate::from_facts::te_admits(&manifest()))],
        });
    }
    for (name, description) in HOST_EXECUTORS {
        c.add(CatalogueEntry {
            name: name.to_string(),
            description: description.to_string(),
            provider: Provider::Host("python".into()),
            admits: Vec::new(),
        });
    }
    c
}

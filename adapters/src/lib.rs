//! Executors for attention backends: the adapter layer between a policy decision (a backend
//! name from a rule pack) and code that runs attention.
//!
//! - [`problem`]: [`AttentionProblem`], the description of one call (shapes, dtype, strides,
//!   mask/window, scale).
//! - [`executor`]: the [`Executor`] trait, its [`Manifest`], [`Unsupported`] and [`ExecError`].
//! - [`registry`]: backend name -> executor ([`Registry::builtin`]).
//! - [`reference`]: CPU float64 oracle. [`chunked`]: CUDA cuBLAS + NVRTC executor (feature `cuda`).
//! - [`from_facts`]: the policy's facts -> an [`AttentionProblem`] (the one conversion).
//! - [`run`]: what `attn-policy run` calls: random inputs, execute, time, verify.
//!
//! GPU code sits behind the `cuda` feature and loads CUDA at run time (cudarc dynamic loading),
//! so the crate builds and tests on machines without CUDA; callers need no `cfg`.

pub mod catalogue;
pub mod chunked;
pub mod cudnn;
pub mod executor;
pub mod from_facts;
pub mod frost;
pub mod problem;
pub mod reference;
pub mod registry;
pub mod rng;
pub mod run;

pub use executor::{
    BackwardInputs, BackwardOutput, DeviceBackwardArgs, DeviceForwardArgs, DeviceKind, ExecError,
    ExecStats, Executor, ForwardInputs, ForwardOutput, HeadDimRange, HostTensor, Manifest,
    Unsupported,
};
pub use from_facts::{NotExpressible, problem_from_facts};
pub use problem::{
    AttentionProblem, DType, DiagonalAlignment, LayoutKind, MaskKind, MaskSpec, Strides,
    TensorLayouts,
};
pub use registry::{Registry, RegistryEntry};

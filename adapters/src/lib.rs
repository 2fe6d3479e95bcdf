//! Executors for attention backends: the adapter layer between a policy decision (a backend
//! name from a rule pack) and code that runs attention.
//!
//! - [`problem`]: [`AttentionProblem`], the description of one call (shapes, dtype, strides,
//!   mask/window, scale).
//! - [`executor`]: the [`Executor`] trait and the [`Plan`] it makes per problem and direction,
//!   its [`Manifest`], [`Unsupported`] and [`ExecError`].
//! - [`registry`]: executor name -> executor, manifest and availability ([`Registry::builtin`]).
//! - [`device`]: CUDA discovery (device count, a device's name and compute capability) and
//!   [`Availability`]; every executor imports it, it imports none of them.
//! - [`reference`]: CPU float64 oracle. [`chunked`]: CUDA cuBLAS + NVRTC executor (feature `cuda`).
//!   [`fused`]: one NVRTC wgmma kernel per call for head dims 264..512 on SM90 (feature `cuda`).
//! - [`from_facts`]: the policy's facts -> an [`AttentionProblem`] (the one conversion).
//!   [`cudnn`]: cuDNN graph API (feature `cudnn`). [`frost`]: cuDNN frontend FROST engines
//!   (feature `frost`). [`host`]: manifests of the executors a Python host provides.
//! - [`chain`]: walks a backend's executor chain (the pack's `executors:`), recording each
//!   entry's outcome. [`live`]: the live device facts (compute capability, loaded cuDNN).
//! - [`trial`]: what `attn-policy run` calls on an executor: random inputs, execute, time,
//!   verify (named apart from the command and the `run_*` functions).
//!
//! GPU code sits behind features (`cuda`, `cudnn`, `frost`) and loads CUDA at run time (cudarc
//! dynamic loading), so the crate builds and tests on machines without CUDA; callers need no
//! `cfg`. Each GPU module has one `cfg` pair: `enabled` (the feature on) and a `disabled` twin
//! with the same registry functions (`create`, `availability`) that say why nothing runs.

pub mod catalogue;
pub mod chain;
pub mod chunked;
pub mod cudnn;
pub mod device;
pub mod executor;
pub mod from_facts;
pub mod frost;
pub mod fused;
pub mod host;
pub mod live;
pub mod problem;
pub mod reference;
pub mod registry;
pub mod rng;
pub mod trial;

pub use chain::{ChainError, ChainOptions, Walked};
pub use device::Availability;
pub use executor::{
    BackwardInputs, BackwardOutput, DeviceBackwardArgs, DeviceForwardArgs, DeviceIo, DeviceKind,
    Direction, ExecError, ExecStats, Executor, Features, ForwardInputs, ForwardOutput,
    HeadDimRange, HostIo, HostOutput, HostTensor, Manifest, Plan, StreamLaunch, Unsupported,
    run_backward, run_forward,
};
pub use from_facts::{NotExpressible, problem_from_facts};
pub use live::{LiveDevice, live_device};
pub use problem::{
    AttentionProblem, DType, DiagonalAlignment, LayoutKind, MaskKind, MaskSpec, SeqLens,
    SeqPacking, SeqRows, SoftmaxKind, Strides, TensorLayouts,
};
pub use registry::{ExecutorInfo, Provider, Registry, RegistryEntry};

//! The PyO3 bridge to the cuDNN frontend's FROST engines (feature `frost`).
//!
//! The embedded module (`bridge.py`) builds pygraphs from the tensors' actual strides and lists
//! the ranked plans; the Rust side picks the plan by name ([`super::select_frost_plan`]) and
//! refuses when none is FROST; execution binds the caller's stream on every call and takes
//! per-call workspace. Plans are cached on both sides under [`FrostKey`] (device included).

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaStream, DevicePtr, DevicePtrMut, result as drv, sys as drv_sys,
};
use pyo3::prelude::*;
use pyo3::types::PyModule;

use super::{FrostEnv, FrostError, FrostKey, VersionProbe, check, select_frost_plan};
use crate::cudnn::spec::{Diagonal, Direction};
use crate::device::{Availability, cuda_devices};
use crate::executor::{
    BackwardInputs, BackwardOutput, ExecError, ExecStats, Executor, ForwardInputs, ForwardOutput,
    HostIo, HostOutput, HostTensor, Manifest, Plan as ExecPlan, Unsupported, direction_mismatch,
    validate_backward_inputs, validate_forward_inputs,
};
use crate::problem::AttentionProblem;

const BRIDGE_PY: &str = include_str!("bridge.py");

impl From<FrostError> for ExecError {
    fn from(e: FrostError) -> Self {
        match e {
            FrostError::Python(m) => ExecError::Backend {
                library: "cudnn-frontend",
                message: m,
            },
            FrostError::Cuda(m) => ExecError::Backend {
                library: "cuda",
                message: m,
            },
            refusal => ExecError::Unsupported {
                reason: refusal.to_string(),
            },
        }
    }
}

fn py_err(e: PyErr) -> FrostError {
    FrostError::Python(Python::attach(|py| {
        let tb = e
            .traceback(py)
            .and_then(|t| t.format().ok())
            .unwrap_or_default();
        let tail: String = tb
            .lines()
            .rev()
            .take(4)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join(" | ");
        format!("{e} [{tail}]")
    }))
}

fn cuda_err(e: drv::DriverError) -> FrostError {
    FrostError::Cuda(format!("{e:?}"))
}

/// Registry constructor: the FROST executor on CUDA device `ordinal` (imports the cuDNN
/// frontend; fails with [`ExecError::NoDevice`] when it cannot be loaded).
pub fn create(ordinal: usize) -> Result<Arc<dyn Executor>, ExecError> {
    match FrostExecutor::new(ordinal) {
        Ok(e) => Ok(Arc::new(Arc::new(e))),
        Err(e) => Err(ExecError::NoDevice {
            reason: e.to_string(),
        }),
    }
}

/// Run-time probe: a CUDA device of compute capability 9.0 or 10.x (the frontend's Python
/// package and its versions are checked when the executor is created).
pub fn availability() -> Availability {
    if let Err(why) = cuda_devices() {
        return Availability::unavailable(why);
    }
    let cc = CudaContext::new(0).and_then(|c| c.compute_capability());
    match cc {
        Ok((major, minor)) if matches!(major * 10 + minor, 90 | 100 | 103) => {
            Availability::Available {
                detail: format!(
                    "sm_{major}{minor}; the cuDNN frontend package is checked on first use"
                ),
            }
        }
        Ok((major, minor)) => {
            Availability::unavailable(format!("no FROST SDPA engine for sm_{major}{minor}"))
        }
        Err(e) => Availability::unavailable(format!("CUDA device 0: {e:?}")),
    }
}

/// A selected FROST plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrostPlan {
    /// Its name (`sdpa_fwd_prefill_sm100[...]`).
    pub name: String,
    /// Index in the ranked list.
    pub index: usize,
    /// Workspace bytes.
    pub workspace: usize,
}

/// The FROST executor on one device.
pub struct FrostExecutor {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ordinal: usize,
    cc: u32,
    module: Py<PyModule>,
    env: FrostEnv,
    /// When false, environment declines (versions) are skipped so the plan-name check alone
    /// decides; used to exercise the name check where FROST's dependencies are absent.
    pub strict_env: bool,
    plans: Mutex<HashMap<FrostKey, Result<FrostPlan, FrostError>>>,
}

impl FrostExecutor {
    /// Loads the frontend (engines enabled before the import) on CUDA device `ordinal`.
    pub fn new(ordinal: usize) -> Result<FrostExecutor, FrostError> {
        // SAFETY: dlopen probe only.
        if !unsafe { drv_sys::is_culib_present() } {
            return Err(FrostError::Declined(
                "the CUDA driver library is not present".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(cuda_err)?;
        let (major, minor) = ctx.compute_capability().map_err(cuda_err)?;
        let stream = ctx.default_stream();
        ctx.bind_to_thread().map_err(cuda_err)?;
        let (module, env) = Python::attach(|py| -> PyResult<(Py<PyModule>, FrostEnv)> {
            let code = CString::new(BRIDGE_PY).expect("no NUL in bridge.py");
            let m = PyModule::from_code(
                py,
                &code,
                c"attn_policy_frost_bridge.py",
                c"attn_policy_frost_bridge",
            )?;
            let enabled: bool = m.getattr("enable_and_import")?.call0()?.extract()?;
            let v = m.getattr("versions")?.call0()?;
            let get = |k: &str| -> PyResult<Option<String>> { v.get_item(k)?.extract() };
            let env = FrostEnv {
                frontend: VersionProbe {
                    dist: super::FRONTEND_DIST,
                    raw: get(super::FRONTEND_DIST)?,
                },
                cutlass_dsl: VersionProbe {
                    dist: super::CUTLASS_DSL_DIST,
                    raw: get(super::CUTLASS_DSL_DIST)?,
                },
                engines_enabled: enabled,
                python: get("python")?.unwrap_or_default(),
            };
            Ok((m.unbind(), env))
        })
        .map_err(|e| {
            FrostError::Declined(format!(
                "the cuDNN frontend Python package cannot be loaded: {}",
                py_err(e)
            ))
        })?;
        Ok(FrostExecutor {
            ctx,
            stream,
            ordinal,
            cc: (major * 10 + minor) as u32,
            module,
            env,
            strict_env: true,
            plans: Mutex::new(HashMap::new()),
        })
    }

    /// What the environment probe found.
    pub fn env(&self) -> &FrostEnv {
        &self.env
    }

    /// Compute capability as major*10+minor.
    pub fn compute_capability(&self) -> u32 {
        self.cc
    }

    /// The executor's stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Gate, environment, build, name check, pin. Cached per [`FrostKey`] (refusals too).
    pub fn frost_plan(
        &self,
        p: &AttentionProblem,
        dir: Direction,
    ) -> Result<FrostPlan, FrostError> {
        check(p, dir, Some(self.cc)).map_err(|u| FrostError::Declined(u.reason))?;
        let reasons = self.env.decline_reasons();
        if self.strict_env && !reasons.is_empty() {
            return Err(FrostError::Declined(reasons.join("; ")));
        }
        let key = FrostKey::of(p, dir, self.ordinal);
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(hit) = plans.get(&key) {
            return hit.clone();
        }
        let result = self.build(p, dir, &key, &reasons.join("; "));
        plans.insert(key, result.clone());
        result
    }

    fn build(
        &self,
        p: &AttentionProblem,
        dir: Direction,
        key: &FrostKey,
        hint: &str,
    ) -> Result<FrostPlan, FrostError> {
        self.ctx.bind_to_thread().map_err(cuda_err)?;
        let m = crate::cudnn::convert::mask_of(p);
        let l = &p.layout;
        let s = |x: crate::problem::Strides| (x.batch, x.head, x.seq);
        let key_str = format!("{key:?}");
        let names: Vec<(String, Option<i64>)> = Python::attach(|py| {
            self.module
                .bind(py)
                .getattr("build")?
                .call1((
                    key_str.as_str(),
                    self.ordinal,
                    dir == Direction::Backward,
                    (
                        p.batch,
                        p.heads_q,
                        p.heads_kv,
                        p.seqlen_q,
                        p.seqlen_kv,
                        p.head_dim_qk,
                        p.head_dim_v,
                    ),
                    p.dtype.rule_name(),
                    (s(l.q), s(l.k), s(l.v), s(l.o)),
                    m.left,
                    m.right,
                    m.diagonal == Diagonal::BottomRight,
                    p.softmax_scale,
                ))?
                .extract()
        })
        .map_err(|e| match py_err(e) {
            FrostError::Python(msg) => FrostError::NotFrost {
                plans: format!("no plan ({msg})"),
                hint: hint.to_string(),
            },
            other => other,
        })?;
        let index = select_frost_plan(&names, hint)?;
        let workspace: usize = Python::attach(|py| {
            self.module
                .bind(py)
                .getattr("select")?
                .call1((key_str.as_str(), index))?
                .extract()
        })
        .map_err(py_err)?;
        Ok(FrostPlan {
            name: names[index].0.clone(),
            index,
            workspace,
        })
    }

    /// Enqueues one call on `stream` (bound per call), with per-call workspace.
    ///
    /// # Safety
    /// `ptrs` must be live device allocations of the problem's spans, in the bridge's order:
    /// forward q, k, v, o, lse; backward q, k, v, o, dO, lse, dq, dk, dv.
    pub unsafe fn enqueue(
        &self,
        p: &AttentionProblem,
        dir: Direction,
        ptrs: &[u64],
        stream: &CudaStream,
    ) -> Result<FrostPlan, FrostError> {
        let plan = self.frost_plan(p, dir)?;
        let key_str = format!("{:?}", FrostKey::of(p, dir, self.ordinal));
        let cu = stream.cu_stream();
        // SAFETY: stream-ordered workspace on the call's stream, freed on it after the call.
        let ws = unsafe { drv::malloc_async(cu, plan.workspace.max(256)) }.map_err(cuda_err)?;
        let run = Python::attach(|py| {
            self.module
                .bind(py)
                .getattr("execute")?
                .call1((
                    key_str.as_str(),
                    self.ordinal,
                    ptrs.to_vec(),
                    ws,
                    cu as usize,
                ))
                .map(|_| ())
        })
        .map_err(py_err);
        // SAFETY: freed in stream order.
        unsafe { drv::free_async(ws, cu) }.map_err(cuda_err)?;
        run.map(|_| plan)
    }

    fn host_forward(
        &self,
        p: &AttentionProblem,
        i: &ForwardInputs<'_>,
    ) -> Result<ForwardOutput, FrostError> {
        let s = &self.stream;
        let q = s.clone_htod(&i.q.data[..p.q_span()]).map_err(cuda_err)?;
        let k = s.clone_htod(&i.k.data[..p.k_span()]).map_err(cuda_err)?;
        let v = s.clone_htod(&i.v.data[..p.v_span()]).map_err(cuda_err)?;
        let mut o = s.alloc_zeros::<u16>(p.o_span()).map_err(cuda_err)?;
        let mut lse = s.alloc_zeros::<f32>(p.lse_len()).map_err(cuda_err)?;
        {
            let ptrs = [
                q.device_ptr(s).0,
                k.device_ptr(s).0,
                v.device_ptr(s).0,
                o.device_ptr_mut(s).0,
                lse.device_ptr_mut(s).0,
            ];
            // SAFETY: fresh buffers of the problem's spans, synchronized below.
            unsafe { self.enqueue(p, Direction::Forward, &ptrs, s) }?;
        }
        s.synchronize().map_err(cuda_err)?;
        Ok(ForwardOutput {
            o: HostTensor {
                dtype: p.dtype,
                data: s.clone_dtoh(&o).map_err(cuda_err)?,
            },
            lse: s.clone_dtoh(&lse).map_err(cuda_err)?,
            stats: ExecStats::default(),
        })
    }

    fn host_backward(
        &self,
        p: &AttentionProblem,
        i: &BackwardInputs<'_>,
    ) -> Result<BackwardOutput, FrostError> {
        let s = &self.stream;
        let up = |d: &[u16]| s.clone_htod(d).map_err(cuda_err);
        let (q, k, v) = (
            up(&i.q.data[..p.q_span()])?,
            up(&i.k.data[..p.k_span()])?,
            up(&i.v.data[..p.v_span()])?,
        );
        let (o, d_o) = (up(&i.o.data[..p.o_span()])?, up(&i.d_o.data[..p.o_span()])?);
        let lse = s.clone_htod(i.lse).map_err(cuda_err)?;
        let mut dq = s.alloc_zeros::<u16>(p.q_span()).map_err(cuda_err)?;
        let mut dk = s.alloc_zeros::<u16>(p.k_span()).map_err(cuda_err)?;
        let mut dv = s.alloc_zeros::<u16>(p.v_span()).map_err(cuda_err)?;
        {
            let ptrs = [
                q.device_ptr(s).0,
                k.device_ptr(s).0,
                v.device_ptr(s).0,
                o.device_ptr(s).0,
                d_o.device_ptr(s).0,
                lse.device_ptr(s).0,
                dq.device_ptr_mut(s).0,
                dk.device_ptr_mut(s).0,
                dv.device_ptr_mut(s).0,
            ];
            // SAFETY: fresh buffers of the problem's spans, synchronized below.
            unsafe { self.enqueue(p, Direction::Backward, &ptrs, s) }?;
        }
        s.synchronize().map_err(cuda_err)?;
        let t = |d: Vec<u16>| HostTensor {
            dtype: p.dtype,
            data: d,
        };
        Ok(BackwardOutput {
            dq: t(s.clone_dtoh(&dq).map_err(cuda_err)?),
            dk: t(s.clone_dtoh(&dk).map_err(cuda_err)?),
            dv: t(s.clone_dtoh(&dv).map_err(cuda_err)?),
            stats: ExecStats::default(),
            d_sink: Vec::new(),
        })
    }
}

/// The executor is a shared handle ([`create`] registers an `Arc<FrostExecutor>`): its plans
/// keep it alive.
impl Executor for Arc<FrostExecutor> {
    fn name(&self) -> &str {
        super::NAME
    }

    fn device_description(&self) -> String {
        format!(
            "sm_{}, cuDNN frontend {}, nvidia-cutlass-dsl {}, Python {}",
            self.cc,
            self.env.frontend.raw.as_deref().unwrap_or("absent"),
            self.env.cutlass_dsl.raw.as_deref().unwrap_or("absent"),
            self.env.python
        )
    }

    fn manifest(&self) -> Manifest {
        super::manifest()
    }

    fn check(&self, problem: &AttentionProblem) -> Result<(), Unsupported> {
        check(problem, Direction::Forward, Some(self.cc))
    }

    /// The gate only: the FROST plan is selected (and cached) when the plan first runs, through
    /// [`FrostExecutor::frost_plan`], and its refusal is the run's.
    fn plan(
        &self,
        problem: &AttentionProblem,
        dir: Direction,
    ) -> Result<Arc<dyn ExecPlan>, ExecError> {
        self.check(problem)?;
        Ok(Arc::new(FrostHostPlan {
            ex: Arc::clone(self),
            p: problem.clone(),
            dir,
        }))
    }
}

/// A FROST plan of the trait: host tensors only (no stream or device path).
struct FrostHostPlan {
    ex: Arc<FrostExecutor>,
    p: AttentionProblem,
    dir: Direction,
}

impl ExecPlan for FrostHostPlan {
    fn executor(&self) -> &str {
        super::NAME
    }

    fn direction(&self) -> Direction {
        self.dir
    }

    fn run_host(&self, io: HostIo<'_>) -> Result<HostOutput, ExecError> {
        let p = &self.p;
        match (self.dir, io) {
            (Direction::Forward, HostIo::Forward(inputs)) => {
                check(p, Direction::Forward, Some(self.ex.cc))?;
                validate_forward_inputs(p, &inputs)?;
                Ok(HostOutput::Forward(self.ex.host_forward(p, &inputs)?))
            }
            (Direction::Backward, HostIo::Backward(inputs)) => {
                check(p, Direction::Backward, Some(self.ex.cc))?;
                validate_backward_inputs(p, &inputs)?;
                Ok(HostOutput::Backward(self.ex.host_backward(p, &inputs)?))
            }
            _ => Err(direction_mismatch(self.dir, io.direction())),
        }
    }
}

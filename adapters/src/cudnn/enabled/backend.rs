//! Lowering of the graph IR to raw `cudnnBackend*` descriptors (cudarc `cudnn::sys`), plan
//! selection and execution. The recipe is `shared/reference/cudnn_sdpa.md` section 3, run on
//! the H200 with cuDNN 9.19.

use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;

use cudarc::cudnn::sys::{
    self, cudnnBackendAttributeName_t as A, cudnnBackendAttributeType_t as T,
    cudnnBackendDescriptorType_t as D,
};

use crate::cudnn::engine::EngineInfo;
use crate::cudnn::graph::{BandMaskOp, DType, GraphIr, NativeStats, Op, PwMode, RedOp, Tensor};

/// A failed cuDNN call: which call, the status, and cuDNN's last error string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call}: {status} {message}")]
pub struct CallError {
    /// What was being done.
    pub call: String,
    /// The status name.
    pub status: String,
    /// `cudnnGetLastErrorString`.
    pub message: String,
}

/// The process's libcudnn (see [`super::dl`]).
pub(crate) fn api() -> Result<&'static super::dl::Api, CallError> {
    super::dl::api().map_err(|e| CallError {
        call: "load libcudnn".into(),
        status: "NOT_LOADED".into(),
        message: e,
    })
}

fn last_error() -> String {
    let Ok(api) = api() else {
        return String::new();
    };
    let mut buf = vec![0u8; 1024];
    // SAFETY: the buffer is writable for its full length, which is passed as max_size.
    unsafe { (api.last_error)(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end])
        .trim()
        .replace('\n', " | ")
}

fn check(st: sys::cudnnStatus_t, call: impl fmt::Display) -> Result<(), CallError> {
    if st == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(CallError {
            call: call.to_string(),
            status: format!("{st:?}"),
            message: last_error(),
        })
    }
}

/// An owned backend descriptor, destroyed on drop.
pub(crate) struct Desc(sys::cudnnBackendDescriptor_t);

impl Drop for Desc {
    fn drop(&mut self) {
        if !self.0.is_null()
            && let Ok(api) = api()
        {
            // SAFETY: created by cudnnBackendCreateDescriptor and destroyed once.
            unsafe { (api.destroy_desc)(self.0) };
        }
    }
}

impl Desc {
    pub(crate) fn new(ty: D) -> Result<Desc, CallError> {
        let api = api()?;
        let mut raw: sys::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(
            unsafe { (api.create_desc)(ty, &mut raw) },
            format_args!("create {ty:?}"),
        )?;
        Ok(Desc(raw))
    }

    pub(crate) fn raw(&self) -> sys::cudnnBackendDescriptor_t {
        self.0
    }

    /// Sets an attribute from a slice of elements of the C type `ty` names.
    ///
    /// # Safety
    /// `E` must be the element type cuDNN expects for `ty` (e.g. `i64` for INT64, a
    /// `cudnnBackendDescriptor_t` for BACKEND_DESCRIPTOR, a `#[repr(u32)]` enum for enum types).
    unsafe fn set<E>(&self, name: A, ty: T, vals: &[E]) -> Result<(), CallError> {
        // SAFETY: forwarded to the caller's contract; the slice outlives the call.
        let api = api()?;
        // SAFETY: forwarded to the caller's contract; the slice outlives the call.
        let st =
            unsafe { (api.set_attr)(self.0, name, ty, vals.len() as i64, vals.as_ptr().cast()) };
        check(st, format_args!("set {name:?}"))
    }

    pub(crate) fn set_i64(&self, name: A, vals: &[i64]) -> Result<(), CallError> {
        // SAFETY: INT64 takes i64 elements.
        unsafe { self.set(name, T::CUDNN_TYPE_INT64, vals) }
    }

    fn set_bool(&self, name: A, v: bool) -> Result<(), CallError> {
        // SAFETY: BOOLEAN takes a C bool (1 byte).
        unsafe { self.set(name, T::CUDNN_TYPE_BOOLEAN, &[v]) }
    }

    fn set_dtype(&self, name: A, v: DType) -> Result<(), CallError> {
        // SAFETY: DATA_TYPE takes cudnnDataType_t (repr u32, the C enum).
        unsafe { self.set(name, T::CUDNN_TYPE_DATA_TYPE, &[cudnn_dtype(v)]) }
    }

    pub(crate) fn set_descs(
        &self,
        name: A,
        descs: &[sys::cudnnBackendDescriptor_t],
    ) -> Result<(), CallError> {
        // SAFETY: BACKEND_DESCRIPTOR takes descriptor handles.
        unsafe { self.set(name, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, descs) }
    }

    fn set_desc(&self, name: A, d: sys::cudnnBackendDescriptor_t) -> Result<(), CallError> {
        self.set_descs(name, &[d])
    }

    pub(crate) fn set_handle(&self, name: A, h: sys::cudnnHandle_t) -> Result<(), CallError> {
        // SAFETY: HANDLE takes a cudnnHandle_t.
        unsafe { self.set(name, T::CUDNN_TYPE_HANDLE, &[h]) }
    }

    pub(crate) fn set_ptrs(&self, name: A, ptrs: &[*mut c_void]) -> Result<(), CallError> {
        // SAFETY: VOID_PTR takes void* elements.
        unsafe { self.set(name, T::CUDNN_TYPE_VOID_PTR, ptrs) }
    }

    pub(crate) fn finalize(&self, what: impl fmt::Display) -> Result<(), CallError> {
        let api = api()?;
        // SAFETY: a live descriptor.
        check(
            unsafe { (api.finalize)(self.0) },
            format_args!("finalize {what}"),
        )
    }

    /// Reads up to `out.len()` elements; returns how many cuDNN wrote.
    ///
    /// # Safety
    /// As for `set`: `E` must match `ty`.
    unsafe fn get<E>(&self, name: A, ty: T, out: &mut [E]) -> Result<usize, CallError> {
        let api = api()?;
        let mut n: i64 = 0;
        // SAFETY: `out` is writable for out.len() elements.
        let st = unsafe {
            (api.get_attr)(
                self.0,
                name,
                ty,
                out.len() as i64,
                &mut n,
                out.as_mut_ptr().cast(),
            )
        };
        check(st, format_args!("get {name:?}"))?;
        Ok(n.max(0) as usize)
    }

    pub(crate) fn get_i64(&self, name: A) -> Result<i64, CallError> {
        let mut v = [0i64];
        // SAFETY: INT64 into i64.
        unsafe { self.get(name, T::CUDNN_TYPE_INT64, &mut v) }?;
        Ok(v[0])
    }

    /// Number of elements of an attribute (a get with zero capacity).
    fn count(&self, name: A, ty: T) -> Result<usize, CallError> {
        let api = api()?;
        let mut n: i64 = 0;
        // SAFETY: zero-capacity query with a null array.
        let st = unsafe { (api.get_attr)(self.0, name, ty, 0, &mut n, std::ptr::null_mut()) };
        check(st, format_args!("count {name:?}"))?;
        Ok(n.max(0) as usize)
    }
}

fn cudnn_dtype(d: DType) -> sys::cudnnDataType_t {
    use sys::cudnnDataType_t as C;
    match d {
        DType::Float => C::CUDNN_DATA_FLOAT,
        DType::Half => C::CUDNN_DATA_HALF,
        DType::Bf16 => C::CUDNN_DATA_BFLOAT16,
        DType::Int32 => C::CUDNN_DATA_INT32,
        DType::Int64 => C::CUDNN_DATA_INT64,
        DType::Boolean => C::CUDNN_DATA_BOOLEAN,
    }
}

fn pw_mode(m: PwMode) -> sys::cudnnPointwiseMode_t {
    use sys::cudnnPointwiseMode_t as P;
    match m {
        PwMode::Add => P::CUDNN_POINTWISE_ADD,
        PwMode::Mul => P::CUDNN_POINTWISE_MUL,
        PwMode::Div => P::CUDNN_POINTWISE_DIV,
        PwMode::Sub => P::CUDNN_POINTWISE_SUB,
        PwMode::Exp => P::CUDNN_POINTWISE_EXP,
        PwMode::Log => P::CUDNN_POINTWISE_LOG,
        PwMode::Identity => P::CUDNN_POINTWISE_IDENTITY,
        PwMode::CmpGe => P::CUDNN_POINTWISE_CMP_GE,
        PwMode::CmpGt => P::CUDNN_POINTWISE_CMP_GT,
        PwMode::CmpLt => P::CUDNN_POINTWISE_CMP_LT,
        PwMode::LogicalAnd => P::CUDNN_POINTWISE_LOGICAL_AND,
        PwMode::GenIndex => P::CUDNN_POINTWISE_GEN_INDEX,
        PwMode::BinarySelect => P::CUDNN_POINTWISE_BINARY_SELECT,
    }
}

/// A lowered operation graph; owns every descriptor it references.
pub(crate) struct LoweredGraph {
    pub(crate) graph: Desc,
    _keep: Vec<Desc>,
}

struct Lowering {
    keep: Vec<Desc>,
    tensors: HashMap<i64, sys::cudnnBackendDescriptor_t>,
}

impl Lowering {
    fn keep(&mut self, d: Desc) -> sys::cudnnBackendDescriptor_t {
        let raw = d.raw();
        self.keep.push(d);
        raw
    }

    fn t(&self, uid: i64) -> sys::cudnnBackendDescriptor_t {
        self.tensors[&uid]
    }

    #[allow(clippy::too_many_arguments)]
    fn pointwise(
        &mut self,
        mode: PwMode,
        prec: DType,
        axis: Option<i64>,
        x: i64,
        b: Option<i64>,
        t: Option<i64>,
        y: i64,
    ) -> Result<sys::cudnnBackendDescriptor_t, CallError> {
        let p = Desc::new(D::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
        // SAFETY: POINTWISE_MODE takes cudnnPointwiseMode_t.
        unsafe {
            p.set(
                A::CUDNN_ATTR_POINTWISE_MODE,
                T::CUDNN_TYPE_POINTWISE_MODE,
                &[pw_mode(mode)],
            )
        }?;
        p.set_dtype(A::CUDNN_ATTR_POINTWISE_MATH_PREC, prec)?;
        if let Some(axis) = axis {
            p.set_i64(A::CUDNN_ATTR_POINTWISE_AXIS, &[axis])?;
        }
        p.finalize(format_args!("pointwise {mode:?}"))?;
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
        op.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, p.raw())?;
        op.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, self.t(x))?;
        if let Some(b) = b {
            op.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, self.t(b))?;
        }
        if let Some(t) = t {
            op.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_TDESC, self.t(t))?;
        }
        op.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, self.t(y))?;
        op.finalize(format_args!("op pointwise {mode:?}"))?;
        self.keep(p);
        Ok(self.keep(op))
    }

    fn band_mask(&mut self, m: &BandMaskOp) -> Result<sys::cudnnBackendDescriptor_t, CallError> {
        let op = Desc::new(D::CUDNN_BACKEND_OPERATION_DIAGONAL_BAND_MASK_DESCRIPTOR)?;
        op.set_desc(
            A::CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_XDESC,
            self.t(m.x),
        )?;
        op.set_desc(
            A::CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_BDESC,
            self.t(m.b),
        )?;
        op.set_desc(
            A::CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_YDESC,
            self.t(m.y),
        )?;
        if let Some(l) = m.left_bound {
            op.set_desc(
                A::CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_LEFT_BOUND_DESC,
                self.t(l),
            )?;
        }
        if let Some(s) = m.shift_right {
            op.set_desc(
                A::CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_SHIFT_RIGHT_BOUND_DESC,
                self.t(s),
            )?;
        }
        if let Some(s) = m.seq_q {
            op.set_desc(
                A::CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_SEQ_LEN_QDESC,
                self.t(s),
            )?;
        }
        if let Some(s) = m.seq_kv {
            op.set_desc(
                A::CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_SEQ_LEN_KVDESC,
                self.t(s),
            )?;
        }
        // SAFETY: COMPARISON_MODE takes cudnnPointwiseMode_t.
        unsafe {
            op.set(
                A::CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_COMPARISON_MODE,
                T::CUDNN_TYPE_POINTWISE_MODE,
                &[pw_mode(m.cmp)],
            )
        }?;
        op.finalize("op diagonal band mask")?;
        Ok(self.keep(op))
    }

    fn op(&mut self, op: &Op) -> Result<sys::cudnnBackendDescriptor_t, CallError> {
        match op {
            Op::Matmul { a, b, c, overrides } => {
                let m = Desc::new(D::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?;
                m.set_dtype(A::CUDNN_ATTR_MATMUL_COMP_TYPE, DType::Float)?;
                m.finalize("matmul")?;
                let o = Desc::new(D::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_MATMUL_ADESC, self.t(*a))?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_MATMUL_BDESC, self.t(*b))?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_MATMUL_CDESC, self.t(*c))?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_MATMUL_DESC, m.raw())?;
                for (name, t) in [
                    (
                        A::CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC,
                        overrides.m,
                    ),
                    (
                        A::CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC,
                        overrides.n,
                    ),
                    (
                        A::CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC,
                        overrides.k,
                    ),
                ] {
                    if let Some(t) = t {
                        o.set_desc(name, self.t(t))?;
                    }
                }
                o.finalize("op matmul")?;
                self.keep(m);
                Ok(self.keep(o))
            }
            Op::Pointwise {
                mode,
                x,
                b,
                t,
                y,
                prec,
                axis,
            } => self.pointwise(*mode, *prec, *axis, *x, *b, *t, *y),
            Op::Reduction { op, x, y } => {
                let r = Desc::new(D::CUDNN_BACKEND_REDUCTION_DESCRIPTOR)?;
                let red = match op {
                    RedOp::Add => sys::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_ADD,
                    RedOp::Max => sys::cudnnReduceTensorOp_t::CUDNN_REDUCE_TENSOR_MAX,
                };
                // SAFETY: REDUCTION_OPERATOR_TYPE takes cudnnReduceTensorOp_t.
                unsafe {
                    r.set(
                        A::CUDNN_ATTR_REDUCTION_OPERATOR,
                        T::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
                        &[red],
                    )
                }?;
                r.set_dtype(A::CUDNN_ATTR_REDUCTION_COMP_TYPE, DType::Float)?;
                r.finalize("reduction")?;
                let o = Desc::new(D::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_REDUCTION_DESC, r.raw())?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, self.t(*x))?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, self.t(*y))?;
                o.finalize("op reduction")?;
                self.keep(r);
                Ok(self.keep(o))
            }
            Op::Reshape { x, y } => {
                let o = Desc::new(D::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_RESHAPE_XDESC, self.t(*x))?;
                o.set_desc(A::CUDNN_ATTR_OPERATION_RESHAPE_YDESC, self.t(*y))?;
                o.finalize("op reshape")?;
                Ok(self.keep(o))
            }
            Op::SdpaFwd {
                q,
                k,
                v,
                o,
                scale,
                stats,
                mask,
            } => {
                let op = Desc::new(D::CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR)?;
                op.set_desc(A::CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, self.t(*q))?;
                op.set_desc(A::CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, self.t(*k))?;
                op.set_desc(A::CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, self.t(*v))?;
                op.set_desc(A::CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, self.t(*o))?;
                op.set_desc(A::CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, self.t(*scale))?;
                match stats {
                    NativeStats::StatsDesc(st) => {
                        op.set_desc(A::CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, self.t(*st))?
                    }
                    NativeStats::Softmax { x, y, stats } => {
                        let sm = Desc::new(D::CUDNN_BACKEND_OPERATION_SOFTMAX_DESCRIPTOR)?;
                        sm.set_desc(A::CUDNN_ATTR_OPERATION_SOFTMAX_XDESC, self.t(*x))?;
                        sm.set_desc(A::CUDNN_ATTR_OPERATION_SOFTMAX_YDESC, self.t(*y))?;
                        sm.set_desc(A::CUDNN_ATTR_OPERATION_SOFTMAX_STATS_DESC, self.t(*stats))?;
                        sm.finalize("op softmax")?;
                        op.set_desc(A::CUDNN_ATTR_OPERATION_SDPA_FWD_SOFTMAX_DESC, sm.raw())?;
                        self.keep(sm);
                    }
                }
                if let Some((band, input, output)) = mask {
                    let ops = band
                        .iter()
                        .map(|m| self.band_mask(m))
                        .collect::<Result<Vec<_>, _>>()?;
                    // the frontend finalizes the mask subgraph without a handle
                    let sub = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
                    sub.set_descs(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &ops)?;
                    sub.finalize("sdpa mask subgraph")?;
                    op.set_desc(A::CUDNN_ATTR_OPERATION_SDPA_FWD_SUBGRAPH, sub.raw())?;
                    op.set_i64(
                        A::CUDNN_ATTR_OPERATION_SDPA_FWD_SUBGRAPH_INPUT_UID,
                        &[*input],
                    )?;
                    op.set_i64(
                        A::CUDNN_ATTR_OPERATION_SDPA_FWD_SUBGRAPH_OUTPUT_UID,
                        &[*output],
                    )?;
                    self.keep(sub);
                }
                op.finalize("op sdpa fwd")?;
                Ok(self.keep(op))
            }
        }
    }
}

/// Lowers `ir` into a finalized operation graph bound to `handle`.
pub(crate) fn lower(ir: &GraphIr, handle: sys::cudnnHandle_t) -> Result<LoweredGraph, CallError> {
    let mut l = Lowering {
        keep: Vec::new(),
        tensors: HashMap::new(),
    };
    // a tensor's ragged-offset tensor is finalized before the tensor that names it
    let (plain, ragged): (Vec<&Tensor>, Vec<&Tensor>) =
        ir.tensors.values().partition(|t| t.ragged.is_none());
    for t in plain.into_iter().chain(ragged) {
        let d = Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
        d.set_dtype(A::CUDNN_ATTR_TENSOR_DATA_TYPE, t.dtype)?;
        d.set_i64(A::CUDNN_ATTR_TENSOR_DIMENSIONS, &t.dims)?;
        d.set_i64(A::CUDNN_ATTR_TENSOR_STRIDES, &t.strides)?;
        d.set_i64(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, &[t.uid])?;
        d.set_i64(A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, &[16])?;
        if t.is_virtual() {
            d.set_bool(A::CUDNN_ATTR_TENSOR_IS_VIRTUAL, true)?;
        }
        if t.is_by_value() {
            d.set_bool(A::CUDNN_ATTR_TENSOR_IS_BY_VALUE, true)?;
        }
        if let Some(r) = t.ragged {
            d.set_desc(A::CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, l.t(r))?;
        }
        d.finalize(format_args!("tensor {}", t.uid))?;
        let raw = l.keep(d);
        l.tensors.insert(t.uid, raw);
    }
    let ops = ir
        .ops
        .iter()
        .map(|op| l.op(op))
        .collect::<Result<Vec<_>, _>>()?;
    let g = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    g.set_descs(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &ops)?;
    // without a handle (or a DEVICEPROP) heuristics return no configs (measured on 9.19)
    g.set_handle(A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle)?;
    g.finalize(format_args!("operation graph {:?}", ir.kind))?;
    Ok(LoweredGraph {
        graph: g,
        _keep: l.keep,
    })
}

/// A finalized execution plan and what it runs.
pub(crate) struct BuiltPlan {
    pub(crate) plan: Desc,
    pub(crate) workspace: usize,
    pub(crate) engine: EngineInfo,
    _cfg: Desc,
    _graph: LoweredGraph,
}

/// Why no plan was accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PlanRefusal {
    /// Heuristics proposed nothing (the graph is not supported here).
    NoConfigs(Vec<String>),
    /// Every proposed engine carries the NONDETERMINISTIC note.
    NoDeterministic(Vec<String>),
    /// Plans built, but none is a fused-attention engine.
    NotFused(Vec<String>),
    /// Every config failed to finalize.
    AllFailed(Vec<String>),
}

fn engine_of(cfg: &Desc) -> Result<(String, bool), CallError> {
    let engine = Desc::new(D::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
    let mut raw = [engine.raw()];
    // SAFETY: BACKEND_DESCRIPTOR into a pre-created descriptor.
    unsafe {
        cfg.get(
            A::CUDNN_ATTR_ENGINECFG_ENGINE,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            &mut raw,
        )
    }?;
    let idx = engine.get_i64(A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX)?;
    let mut tag = format!("eng{idx}");
    let knobs = (0..32)
        .map(|_| Desc::new(D::CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR))
        .collect::<Result<Vec<_>, _>>()?;
    let mut raws: Vec<_> = knobs.iter().map(Desc::raw).collect();
    // SAFETY: BACKEND_DESCRIPTOR into pre-created descriptors.
    let n = unsafe {
        cfg.get(
            A::CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            &mut raws,
        )
    }?;
    for k in knobs.iter().take(n) {
        let mut ty = [0u32];
        // SAFETY: KNOB_TYPE is a C enum (4 bytes); read as u32 to accept values newer than cudarc.
        unsafe {
            k.get(
                A::CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                T::CUDNN_TYPE_KNOB_TYPE,
                &mut ty,
            )
        }?;
        let v = k.get_i64(A::CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE)?;
        tag.push_str(&format!("_k{}={v}", ty[0]));
    }
    let mut notes = [0u32; 16];
    // SAFETY: NUMERICAL_NOTE is a C enum array, read as u32.
    let n = unsafe {
        engine.get(
            A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
            T::CUDNN_TYPE_NUMERICAL_NOTE,
            &mut notes,
        )
    }?;
    let nondet = sys::cudnnBackendNumericalNote_t::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC as u32;
    Ok((tag, notes[..n.min(16)].contains(&nondet)))
}

fn plan_json(plan: &Desc) -> Result<String, CallError> {
    let n = plan.count(
        A::CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
        T::CUDNN_TYPE_CHAR,
    )?;
    let mut buf = vec![0u8; n + 1];
    // SAFETY: CHAR into a byte buffer of n + 1.
    let got = unsafe {
        plan.get(
            A::CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
            T::CUDNN_TYPE_CHAR,
            &mut buf[..n],
        )
    }?;
    buf.truncate(got.min(n));
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn heuristics(graph: &Desc, mode: sys::cudnnBackendHeurMode_t) -> Result<Vec<Desc>, CallError> {
    let h = Desc::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    h.set_desc(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph.raw())?;
    // SAFETY: HEUR_MODE takes cudnnBackendHeurMode_t.
    unsafe {
        h.set(
            A::CUDNN_ATTR_ENGINEHEUR_MODE,
            T::CUDNN_TYPE_HEUR_MODE,
            &[mode],
        )
    }?;
    h.finalize(format_args!("heuristics {mode:?}"))?;
    let n = h.count(
        A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
        T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
    )?;
    let cfgs = (0..n)
        .map(|_| Desc::new(D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
        .collect::<Result<Vec<_>, _>>()?;
    if cfgs.is_empty() {
        return Ok(cfgs);
    }
    let mut raws: Vec<_> = cfgs.iter().map(Desc::raw).collect();
    // SAFETY: BACKEND_DESCRIPTOR into pre-created descriptors.
    let got = unsafe {
        h.get(
            A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            &mut raws,
        )
    }?;
    let mut cfgs = cfgs;
    cfgs.truncate(got);
    Ok(cfgs)
}

/// Heuristics mode A, then FALLBACK; the first config that finalizes into a plan, is a
/// fused-attention engine (when `require_fused`) and is not marked NONDETERMINISTIC (when
/// `deterministic`) wins. Nothing else is ever returned.
pub(crate) fn build_plan(
    graph: LoweredGraph,
    handle: sys::cudnnHandle_t,
    deterministic: bool,
    require_fused: bool,
) -> Result<Result<BuiltPlan, PlanRefusal>, CallError> {
    let mut proposed = 0usize;
    let mut nondet = Vec::new();
    let mut not_fused = Vec::new();
    let mut failed = Vec::new();
    let mut heur_errors = Vec::new();
    for mode in [
        sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A,
        sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_FALLBACK,
    ] {
        let cfgs = match heuristics(&graph.graph, mode) {
            Ok(c) => c,
            Err(e) => {
                heur_errors.push(e.to_string());
                continue;
            }
        };
        proposed += cfgs.len();
        for cfg in cfgs {
            let (tag, is_nondet) = engine_of(&cfg)?;
            if deterministic && is_nondet {
                nondet.push(tag);
                continue;
            }
            let plan = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
            plan.set_handle(A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle)?;
            plan.set_desc(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg.raw())?;
            if let Err(e) = plan.finalize(format_args!("plan {tag}")) {
                failed.push(e.to_string());
                continue;
            }
            let json = plan_json(&plan).unwrap_or_default();
            let engine = EngineInfo::from_plan_json(&json, tag, is_nondet);
            if require_fused && !engine.is_fused_attention() {
                not_fused.push(engine.summary());
                continue;
            }
            let workspace = plan
                .get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?
                .max(0) as usize;
            return Ok(Ok(BuiltPlan {
                plan,
                workspace,
                engine,
                _cfg: cfg,
                _graph: graph,
            }));
        }
    }
    Ok(Err(if proposed == 0 {
        PlanRefusal::NoConfigs(heur_errors)
    } else if !not_fused.is_empty() {
        PlanRefusal::NotFused(not_fused)
    } else if !nondet.is_empty() && failed.is_empty() {
        PlanRefusal::NoDeterministic(nondet)
    } else {
        failed.extend(nondet.into_iter().map(|t| format!("{t}: NONDETERMINISTIC")));
        PlanRefusal::AllFailed(failed)
    }))
}

/// Builds a variant pack and executes `plan` on `handle` (whose stream the caller has bound).
///
/// # Safety
/// Every pointer must be valid for what the graph reads/writes (device memory for tensors, host
/// memory holding the value for by-value scalars) until the work completes on the stream.
pub(crate) unsafe fn execute(
    handle: sys::cudnnHandle_t,
    plan: &BuiltPlan,
    uids: &[i64],
    ptrs: &[*mut c_void],
    workspace: *mut c_void,
) -> Result<(), CallError> {
    let vp = Desc::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
    vp.set_i64(A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids)?;
    vp.set_ptrs(A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, ptrs)?;
    vp.set_ptrs(A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE, &[workspace])?;
    vp.finalize("variant pack")?;
    let api = api()?;
    // SAFETY: the caller guarantees the pointers; plan and pack are finalized.
    check(
        unsafe { (api.execute)(handle, plan.plan.raw(), vp.raw()) },
        "cudnnBackendExecute",
    )
}

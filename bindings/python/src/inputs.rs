//! The one check of an attention call's tensors (issue 30, part 6), before anything is decided
//! or planned: every entry path of `attn_policy.torch` (the eager call, the op and its fake, the
//! op's backward, the context-parallel shards) hands it what each tensor is (`TensorArg`, read
//! by `attn_policy.torch._tensor_arg`), and the native plans check the pointers they are given
//! against the same storage extents (`torch_ops::check_buffer`), so Python, the C++ eager node's
//! ABI and the plans agree on what may be read.
//!
//! What is refused, with `InvalidInput` (`ShapeMismatch` where two sizes disagree): a tensor
//! that is not strided, on a device other than CPU or CUDA (a meta tensor holds no data), not
//! 4-D (3-D for the packed `thd` layout), of a dtype other than fp16/bf16/fp32/fp64, dtypes or devices that differ, a zero-sized
//! batch / heads / sequence length / head dim, batch, heads, sequence lengths or head dims that
//! disagree (no broadcasting: both shapes are named), query heads not a multiple of the KV
//! heads, and strides that reach outside a tensor's storage; in the backward, dO and O of
//! another shape or dtype than the call's O, the LSE other than `[b, h_q, s_q]` of its dtype.

use pyo3::create_exception;
use pyo3::prelude::*;

use crate::torch_ops::InvalidInput;

create_exception!(
    _native,
    ShapeMismatch,
    InvalidInput,
    "Two tensors of one call disagree on a size they must share (batch, heads, sequence length, \
     head dim), or a tensor of the backward (dO, O, LSE) has another shape than the call gives \
     it. Broadcasting is refused, not emulated: the message names both shapes."
);

/// What one tensor argument is, as Python reads it: (name, torch layout (`torch.strided`),
/// device (`cpu`, `cuda:0`, `meta`), dtype (`torch.float32`), shape, strides (empty unless
/// strided), storage offset in elements, the storage's bytes (None: not read, as for a fake
/// tensor or a subclass without a storage of its own), element size in bytes).
pub type TensorArg = (
    String,
    String,
    String,
    String,
    Vec<i64>,
    Vec<i64>,
    i64,
    Option<u64>,
    u64,
);

const LAYOUTS: [&str; 4] = ["bhsd", "bshd", "sbhd", "thd"];
/// Index of the packed layout `thd` (`[tokens, heads, head dim]`, one batch of packed sequences).
const THD: usize = 3;
const DIM_NAMES: [&str; 4] = ["batch", "heads", "sequence length", "head dim"];
const DTYPES: [&str; 4] = [
    "torch.float16",
    "torch.bfloat16",
    "torch.float32",
    "torch.float64",
];

/// Why a call's tensors are refused.
#[derive(Debug, PartialEq)]
pub enum Refusal {
    Invalid(String),
    Shape(String),
}

impl From<Refusal> for PyErr {
    fn from(r: Refusal) -> PyErr {
        match r {
            Refusal::Invalid(m) => InvalidInput::new_err(m),
            Refusal::Shape(m) => ShapeMismatch::new_err(m),
        }
    }
}

#[derive(Clone, Copy)]
struct T<'a> {
    name: &'a str,
    layout: &'a str,
    device: &'a str,
    dtype: &'a str,
    shape: &'a [i64],
    strides: &'a [i64],
    offset: i64,
    nbytes: Option<u64>,
    itemsize: u64,
}

impl<'a> T<'a> {
    fn of(a: &'a TensorArg) -> T<'a> {
        T {
            name: &a.0,
            layout: &a.1,
            device: &a.2,
            dtype: &a.3,
            shape: &a.4,
            strides: &a.5,
            offset: a.6,
            nbytes: a.7,
            itemsize: a.8,
        }
    }

    fn shape_text(&self) -> String {
        tuple(self.shape)
    }
}

/// Python's `repr` of a tuple of ints: `(1, 2)`, `(5,)`, `()`.
fn tuple(xs: &[i64]) -> String {
    match xs {
        [x] => format!("({x},)"),
        _ => format!(
            "({})",
            xs.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn invalid(m: String) -> Result<(), Refusal> {
    Err(Refusal::Invalid(m))
}

/// One tensor on its own: strided, on CPU or CUDA.
fn check_tensor(t: &T) -> Result<(), Refusal> {
    if t.layout != "torch.strided" {
        return invalid(format!(
            "{} is a {} tensor; attention takes strided (dense) tensors",
            t.name, t.layout
        ));
    }
    let kind = t.device.split(':').next().unwrap_or("");
    if kind != "cpu" && kind != "cuda" {
        let what = if kind == "meta" {
            "holds no data"
        } else {
            "is not supported"
        };
        return invalid(format!(
            "{} is on device {}, which {what}; attn_policy runs CPU and CUDA tensors",
            t.name, t.device
        ));
    }
    Ok(())
}

/// Dims of a tensor in layout `layout`: 4 (`bhsd`, `bshd`, `sbhd`) or 3 (`thd`).
fn rank(layout: usize) -> usize {
    if layout == THD { 3 } else { 4 }
}

/// (b, h, s, d) of a tensor in layout `layout` (`thd`: one batch of `t` tokens).
fn bhsd(t: &T, layout: usize) -> [i64; 4] {
    let s = t.shape;
    match layout {
        0 => [s[0], s[1], s[2], s[3]],
        1 => [s[0], s[2], s[1], s[3]],
        THD => [1, s[1], s[0], s[2]],
        _ => [s[1], s[2], s[0], s[3]],
    }
}

/// Why `t`'s sizes, strides and offset reach outside its storage, or None (also when the
/// storage was not read).
fn storage_fault(t: &T) -> Option<String> {
    let nbytes = t.nbytes?;
    let (mut lo, mut hi) = (t.offset as i128, t.offset as i128);
    for (&n, &st) in t.shape.iter().zip(t.strides) {
        if n > 1 {
            let reach = (n as i128 - 1) * st as i128;
            if st < 0 {
                lo += reach;
            } else {
                hi += reach;
            }
        }
    }
    if lo < 0 || (hi + 1) * t.itemsize as i128 > nbytes as i128 {
        return Some(format!(
            "{} (shape {}, strides {}, offset {}) reaches elements {lo}..{hi} of a storage of \
             {nbytes} bytes ({}): its strides do not fit inside its storage",
            t.name,
            t.shape_text(),
            tuple(t.strides),
            t.offset,
            t.dtype
        ));
    }
    None
}

fn check_storage(ts: &[T]) -> Result<(), Refusal> {
    match ts.iter().find_map(storage_fault) {
        Some(why) => invalid(why),
        None => Ok(()),
    }
}

/// Q, K, V of one call in layout `layout` (an index into `LAYOUTS`).
fn check_inputs(layout: usize, q: &T, k: &T, v: &T) -> Result<(), Refusal> {
    let lname = LAYOUTS[layout];
    let named = [q, k, v];
    for t in named {
        check_tensor(t)?;
    }
    let want = rank(layout);
    if named.iter().any(|t| t.shape.len() != want) {
        return invalid(format!(
            "q, k, v must be {want}-D ({lname}); found {}, {}, {} dims",
            q.shape.len(),
            k.shape.len(),
            v.shape.len()
        ));
    }
    if !(q.dtype == k.dtype && k.dtype == v.dtype) {
        return invalid(format!(
            "q, k, v must have one dtype; found {}, {}, {}",
            q.dtype, k.dtype, v.dtype
        ));
    }
    if !DTYPES.contains(&q.dtype) {
        return invalid(format!(
            "dtype {} cannot be executed (float16, bfloat16, float32, float64)",
            q.dtype
        ));
    }
    if !(q.device == k.device && k.device == v.device) {
        return invalid(format!(
            "q, k, v must be on one device; found {}, {}, {}",
            q.device, k.device, v.device
        ));
    }
    let dims = named.map(|t| bhsd(t, layout));
    for (t, d) in named.iter().zip(&dims) {
        if let Some(i) = d.iter().position(|&n| n == 0) {
            return invalid(format!(
                "{} has a zero-sized {} (shape {}, layout {lname}): attention needs at least one \
                 element in each of batch, heads, sequence length and head dim",
                t.name,
                DIM_NAMES[i],
                t.shape_text()
            ));
        }
    }
    // Pairs that must agree: (dim index, tensor a, tensor b).
    for (i, a, c) in [(0, 0, 1), (0, 0, 2), (1, 1, 2), (2, 1, 2), (3, 0, 1)] {
        let (x, y) = (dims[a][i], dims[c][i]);
        if x != y {
            let (ta, tc) = (named[a], named[c]);
            // A size of 1 against another is what broadcasting would stretch: say it is not done.
            let hint = if x == 1 || y == 1 {
                "; attn_policy does not broadcast (expand the tensor explicitly if that is meant)"
            } else {
                ""
            };
            return Err(Refusal::Shape(format!(
                "{} and {} differ in {} ({x} vs {y}): {} has shape {}, {} {} (layout \
                 {lname}){hint}",
                ta.name,
                tc.name,
                DIM_NAMES[i],
                ta.name,
                ta.shape_text(),
                tc.name,
                tc.shape_text()
            )));
        }
    }
    let (hq, hkv) = (dims[0][1], dims[1][1]);
    if hq % hkv != 0 {
        return Err(Refusal::Shape(format!(
            "heads_q ({hq}) is not a multiple of heads_kv ({hkv}): q {}, k {}, v {} (layout \
             {lname})",
            q.shape_text(),
            k.shape_text(),
            v.shape_text()
        )));
    }
    check_storage(&[*q, *k, *v])
}

/// The backward's tensors: `check_inputs`, then dO and O of the forward's O shape and dtype,
/// the LSE `[b, h_q, s_q]` of its dtype (float64 for float64 inputs, else float32), all on Q's
/// device, inside their storage.
fn check_backward(layout: usize, ts: &[T; 6]) -> Result<(), Refusal> {
    let [q, k, v, g, o, lse] = ts;
    check_inputs(layout, q, k, v)?;
    let extra = [g, o, lse];
    for t in extra {
        check_tensor(t)?;
        if t.device != q.device {
            return invalid(format!(
                "{} is on {}, q on {}: one device",
                t.name, t.device, q.device
            ));
        }
    }
    let last = rank(layout) - 1;
    let mut want_o = q.shape[..last].to_vec();
    want_o.push(v.shape[last]);
    // The LSE is `[b, h_q, s_q]` (`[1, h_q, t_q]` for packed `thd`).
    let [b, hq, sq, _] = bhsd(q, layout);
    let lse_dtype = if q.dtype == "torch.float64" {
        "torch.float64"
    } else {
        "torch.float32"
    };
    for (t, shape, dtype) in [
        (o, want_o.clone(), q.dtype),
        (g, want_o, q.dtype),
        (lse, vec![b, hq, sq], lse_dtype),
    ] {
        if t.shape != shape.as_slice() {
            return Err(Refusal::Shape(format!(
                "{} has shape {}, the call's is {} (q {}, v {}, layout {}); attn_policy does not \
                 broadcast or reshape it",
                t.name,
                t.shape_text(),
                tuple(&shape),
                q.shape_text(),
                v.shape_text(),
                LAYOUTS[layout]
            )));
        }
        if t.dtype != dtype {
            return invalid(format!(
                "{} has dtype {}, the call's is {dtype}",
                t.name, t.dtype
            ));
        }
    }
    check_storage(&[*g, *o, *lse])
}

/// Checks one call's tensors: Q, K, V (the forward) or Q, K, V, dO, O, LSE (the backward), in
/// layout `layout` (0 bhsd, 1 bshd, 2 sbhd, 3 thd: `[tokens, heads, head dim]`); `storage_only` checks only that each one's strides
/// fit inside its storage (a cached call, whose signature fixed everything else). Raises
/// `InvalidInput` or `ShapeMismatch`.
#[pyfunction]
#[pyo3(signature = (layout, tensors, storage_only=false))]
pub fn check_tensors(layout: usize, tensors: Vec<TensorArg>, storage_only: bool) -> PyResult<()> {
    if layout >= LAYOUTS.len() {
        return Err(InvalidInput::new_err(format!(
            "layout {layout}: 0 (bhsd), 1 (bshd), 2 (sbhd) or 3 (thd)"
        )));
    }
    let ts: Vec<T> = tensors.iter().map(T::of).collect();
    if storage_only {
        return Ok(check_storage(&ts)?);
    }
    Ok(match ts.as_slice() {
        [q, k, v] => check_inputs(layout, q, k, v),
        [q, k, v, g, o, lse] => check_backward(layout, &[*q, *k, *v, *g, *o, *lse]),
        _ => {
            return Err(InvalidInput::new_err(format!(
                "check_tensors takes 3 tensors (q, k, v) or 6 (q, k, v, dO, O, LSE); found {}",
                tensors.len()
            )));
        }
    }?)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("ShapeMismatch", m.py().get_type::<ShapeMismatch>())?;
    m.add_function(wrap_pyfunction!(check_tensors, m)?)?;
    Ok(())
}

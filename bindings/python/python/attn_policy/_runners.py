"""Runners: what a chosen executor does with tensors. Native plans (``reference``, ``cudnn``,
``chunked``, ... through :class:`_NativeRunner`, or the C++ eager node), ``torch_math`` and the
SDPA fallback of ``on_decline="fallback"``; torch's own kernels (``torch_flash``,
``torch_efficient``, ``torch_cudnn``) are in ``_kernel_runners``."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from . import PolicyError, _native, eager_node
from ._autograd import _eager_apply, _eager_sink_apply
from ._call import LEARNABLE, _Call
from ._decision import InvalidInput
from ._tensors import _from_bhsd, _like, _o_shape, _restrided, _to_bhsd, lse_dtype


class _Runner:
    executor = ""
    # Whether the plan itself checks every pointer against its storage (native plans); the
    # direct eager path checks the others' storage in Python on every call.
    checks_storage = False

    def forward(self, q, k, v, sink=None) -> Tuple[torch.Tensor, torch.Tensor]:
        """O and the LSE. ``sink``: the learnable sink logits ``[h_q]`` (only runners whose
        executor serves them are given one: the others' manifests refuse the feature)."""
        raise NotImplementedError

    def backward(self, g, q, k, v, o, lse, sink=None) -> Tuple[torch.Tensor, ...]:
        """dQ, dK, dV (and the sink logits' gradient, in the sink's dtype, when ``sink`` is
        given)."""
        raise NotImplementedError

    def apply(self, q, k, v) -> torch.Tensor:
        """O of an eager call that needs gradients (the Python autograd Function)."""
        return _eager_apply(q, k, v, self)

    def output(self, q, k, v) -> torch.Tensor:
        """O of an eager call that needs no gradient."""
        return self.forward(q, k, v)[0]

    def apply_sink(self, q, k, v, sink) -> torch.Tensor:
        """O of an eager call with learnable sink logits that needs gradients (the sink's too)."""
        return _eager_sink_apply(q, k, v, sink, self)


_empty = torch.empty
_empty_strided = torch.empty_strided
_F32 = torch.float32
_U8 = torch.uint8
# The current stream of a device as an int, without a Stream object.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _no_stream(index: int) -> int:
    return 0


def _avail(t: torch.Tensor) -> int:
    """The bytes ``t``'s storage holds from its data pointer (what a native plan may touch)."""
    return max(t.untyped_storage().nbytes() - t.storage_offset() * t.element_size(), 0)


class _NativeRunner(_Runner):
    """A built-in executor through a native plan (pointers in, nothing allocated natively).
    What the input signature fixes (shapes, strides, dtype, device, forward workspace) is read
    once here, so a call only allocates, reads pointers and enqueues."""

    def __init__(self, plan, call: _Call, host_copy: bool):
        self.plan, self.executor = plan, plan.executor
        self.host_copy = host_copy  # CUDA tensors through the CPU reference (a last resort)
        # The plan checks the pointers it is given; a host copy of a CUDA tensor is made by torch.
        self.checks_storage = not host_copy
        self.ws_fwd = plan.workspace_forward
        self.lse_shape = call.lse_shape
        # A learnable sink: the logits (fp32 [h_q], as the executors read them) come with each
        # call, and the backward returns their gradient.
        self.learnable, self.hq = call.softmax == LEARNABLE, call.hq
        self.lse_dtype = lse_dtype(call.dtype)
        self.o_shape = call.o_shape
        self.dtype, self.device = call.dtype, call.device
        self.cuda = call.device.type == "cuda" and not host_copy
        self.index = call.device.index if call.device.index is not None else 0
        self._fwd, self._bwd, self._ws_bwd = plan.forward, plan.backward, plan.workspace_backward
        self._stream = _raw_stream if self.cuda else _no_stream
        if not host_copy and not call.has_features:
            # Eager calls through the C++ node where it builds (attn_policy.eager_node): its
            # backward runs no Python, so it takes no GIL on autograd's thread, and its forward
            # allocates in C++. It passes no sink and allocates the LSE of unpacked calls: a
            # call with features runs through the Python autograd Function.
            node = eager_node.op()
            if node is not None:
                self.apply = _through_node(node.attention, plan.handle)
                self.output = _through_node(node.forward, plan.handle)

    def _no_capture(self):
        if self.host_copy and torch.cuda.is_current_stream_capturing():
            raise PolicyError(
                "the reference executor runs CUDA tensors through host copies, which a CUDA graph "
                "cannot capture (it ran as a substitute for this call: see the decision)"
            )

    def _sink32(self, sink, device) -> Optional[torch.Tensor]:
        """The sink logits as the executors read them (fp32, contiguous ``[h_q]``), or None."""
        return _sink_logits(self.learnable, self.hq, sink, device)

    def forward(self, q, k, v, sink=None):
        if self.host_copy:
            return self._forward_through_host(q, k, v, sink)
        dev = self.device
        s32 = self._sink32(sink, dev)
        o = _empty(self.o_shape, dtype=self.dtype, device=dev)
        lse = _empty(self.lse_shape, dtype=self.lse_dtype, device=dev)
        n = self.ws_fwd
        ws = _empty((n,), dtype=_U8, device=dev) if n else None
        if s32 is None:
            self._fwd(
                q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                (_avail(q), _avail(k), _avail(v), _avail(o), _avail(lse)),
                ws.data_ptr() if n else 0, n, self._stream(self.index),
            )
        else:
            self._fwd(
                q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                (_avail(q), _avail(k), _avail(v), _avail(o), _avail(lse)),
                ws.data_ptr() if n else 0, n, self._stream(self.index), sink=s32.data_ptr(), sink_avail=_avail(s32),
            )
        return o, lse

    def backward(self, g, q, k, v, o, lse, sink=None):
        if self.host_copy:
            return self._backward_through_host(g, q, k, v, o, lse, sink)
        dev, dt = self.device, self.dtype
        s32 = self._sink32(sink, dev)
        dq = _empty_strided(q.shape, q.stride(), dtype=dt, device=dev)
        dk = _empty_strided(k.shape, k.stride(), dtype=dt, device=dev)
        dv = _empty_strided(v.shape, v.stride(), dtype=dt, device=dev)
        # Per call: the backward plan lives on the calling thread (autograd's), built there once.
        n = self._ws_bwd() if self.cuda else 0
        ws = _empty((n,), dtype=_U8, device=dev) if n else None
        args = (
            q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), g.data_ptr(), lse.data_ptr(),
            dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
            tuple(_avail(t) for t in (q, k, v, o, g, lse, dq, dk, dv)), ws.data_ptr() if n else 0, n,
            self._stream(self.index),
        )
        if s32 is None:
            self._bwd(*args)
            return dq, dk, dv
        d_sink = torch.zeros(self.hq, dtype=_F32, device=dev)
        self._bwd(*args, sink=s32.data_ptr(), d_sink=d_sink.data_ptr(), sink_avail=_avail(s32),
                  d_sink_avail=_avail(d_sink))
        return dq, dk, dv, d_sink.to(sink.dtype)

    def _forward_through_host(self, q, k, v, sink=None):
        self._no_capture()
        dev = q.device
        s32 = self._sink32(sink, dev)
        q, k, v = q.cpu(), k.cpu(), v.cpu()
        o = torch.empty(_o_shape(q, v), dtype=q.dtype)
        lse = torch.empty(self.lse_shape, dtype=self.lse_dtype)
        extra = {}
        if s32 is not None:
            s32 = s32.cpu()
            extra = {"sink": s32.data_ptr(), "sink_avail": _avail(s32)}
        self._fwd(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                  tuple(_avail(t) for t in (q, k, v, o, lse)), **extra)
        return o.to(dev), lse.to(dev)

    def _backward_through_host(self, g, q, k, v, o, lse, sink=None):
        self._no_capture()
        dev = q.device
        s32 = self._sink32(sink, dev)
        g, q, k, v, o, lse = (t.cpu() for t in (g, q, k, v, o, lse))
        dq, dk, dv = _like(q), _like(k), _like(v)
        extra, d_sink = {}, None
        if s32 is not None:
            s32, d_sink = s32.cpu(), torch.zeros(self.hq, dtype=_F32)
            extra = {"sink": s32.data_ptr(), "d_sink": d_sink.data_ptr(), "sink_avail": _avail(s32),
                     "d_sink_avail": _avail(d_sink)}
        self._bwd(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), g.data_ptr(), lse.data_ptr(),
            dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
            tuple(_avail(t) for t in (q, k, v, o, g, lse, dq, dk, dv)), **extra,
        )
        if d_sink is None:
            return dq.to(dev), dk.to(dev), dv.to(dev)
        return dq.to(dev), dk.to(dev), dv.to(dev), d_sink.to(device=dev, dtype=sink.dtype)


_NODE_ERRORS = {
    "ExecutorRefused": _native.ExecutorRefused,
    "ExecutorUnavailable": _native.ExecutorUnavailable,
    "InvalidInput": InvalidInput,
    "ExecutorFailed": _native.ExecutorFailed,
}


def _retyped(e: RuntimeError) -> Exception:
    """The typed exception of an error the C++ node raised (``attn_policy[Kind]: message``)."""
    msg = str(e)
    if msg.startswith("attn_policy[") and "]: " in msg:
        kind, _, rest = msg[len("attn_policy["):].partition("]: ")
        cls = _NODE_ERRORS.get(kind)
        if cls is not None:
            return cls(rest)
    return e


def _through_node(node_op, handle: int):
    """An eager call's O through an op of the C++ node, for the plan at ``handle``."""
    def call(q, k, v):
        try:
            return node_op(q, k, v, handle)
        except RuntimeError as e:
            typed = _retyped(e)
            if typed is e:
                raise
            raise typed from None
    return call


def _mask_bool(call_like, sq: int, skv: int, device) -> Optional[torch.Tensor]:
    """Allowed (query, key) pairs, ``[s_q, s_kv]``, or None when everything is allowed."""
    mask, wl, wr, br = call_like
    off = (skv - sq) if br else 0
    if mask != 0:
        wr = 0 if wr < 0 else min(wr, 0)
    if wl < 0 and wr < 0:
        return None
    i = torch.arange(sq, device=device).unsqueeze(1) + off
    j = torch.arange(skv, device=device).unsqueeze(0)
    ok = torch.ones(sq, skv, dtype=torch.bool, device=device)
    if wl >= 0:
        ok &= j >= i - wl
    if wr >= 0:
        ok &= j <= i + wr
    return ok


def _padded_mask(mask_args, packing: int, lens_q, lens_kv, sq: int, skv: int, device) -> torch.Tensor:
    """Allowed (query, key) pairs of a padded batch, ``[b, 1, s_q, s_kv]``: each sequence's
    tokens (at the start of its rows, ``packing`` 1, or at their end, 2), its mask in its own
    coordinates; padding rows and keys admit nothing."""
    lq = torch.tensor(lens_q, dtype=torch.int64, device=device).view(-1, 1, 1)
    lkv = torch.tensor(lens_kv, dtype=torch.int64, device=device).view(-1, 1, 1)
    r = torch.arange(sq, device=device).view(1, -1, 1)
    c = torch.arange(skv, device=device).view(1, 1, -1)
    # Each row's and key's position inside its own sequence.
    i = r if packing == 1 else r - (sq - lq)
    j = c if packing == 1 else c - (skv - lkv)
    ok = (i >= 0) & (i < lq) & (j >= 0) & (j < lkv)
    mask, wl, wr, br = mask_args
    if mask != 0:
        wr = 0 if wr < 0 else min(wr, 0)
    d = i + (lkv - lq) if br else i  # the diagonal of the sequence's own rectangle
    if wl >= 0:
        ok = ok & (j >= d - wl)
    if wr >= 0:
        ok = ok & (j <= d + wr)
    return ok.unsqueeze(1)


def _attend(qh, kh, vh, allowed, scale, softcap, sink):
    """O and LSE of ``[b, h, s, d]`` tensors already in the accumulation dtype (K/V with the
    query heads): scores ``scale * q.k``, soft-capped (``softcap`` > 0), masked (``allowed``
    broadcast to ``[b, h, s_q, s_kv]``, None: every key), a softmax whose denominator adds
    ``exp(sink[h])`` (``sink``: ``[h_q]`` logits or None). A row that sees no key: O = 0,
    LSE = -inf, and no gradient flows back from it (to the sink neither)."""
    s = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    if sink is None:
        lse = torch.logsumexp(s, dim=-1)
        empty = lse == float("-inf")
    else:
        b, h, sq, _ = s.shape
        col = sink.to(s.dtype).view(1, h, 1, 1).expand(b, h, sq, 1)
        lse = torch.logsumexp(torch.cat([s, col], dim=-1), dim=-1)
        # Empty rows by the mask alone: the sink's term would make their LSE s_h.
        empty = ((~allowed).all(-1).expand(b, h, sq) if allowed is not None
                 else torch.zeros(lse.shape, dtype=torch.bool, device=lse.device))
    # (Where: no gradient reaches the LSE of an empty row, so none reaches the sink from it.)
    lse = torch.where(empty, torch.zeros((), dtype=lse.dtype, device=lse.device), lse)
    p = torch.exp(s - lse.unsqueeze(-1))
    p = torch.nan_to_num(p, nan=0.0)
    o = torch.matmul(p, vh)
    return o, lse.masked_fill(empty, float("-inf"))


def _heads(kh, vh, hq):
    hkv = kh.shape[1]
    if hq != hkv:
        kh = kh.repeat_interleave(hq // hkv, dim=1)
        vh = vh.repeat_interleave(hq // hkv, dim=1)
    return kh, vh


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype in (torch.float64, torch.float32) else torch.float32


def _math_forward(q, k, v, layout, mask_args, scale, softcap=0.0, sink=None, packing=0, lens_q=(), lens_kv=(),
                  padded_mask=None):
    """O and LSE from tensor ops (float32 for 16-bit inputs, float64 for fp32 and fp64); rows
    with no key: O = 0, LSE = -inf. The features as the native problem states them:
    ``softcap`` (0: none), ``sink`` (the ``[h_q]`` sink logits, zeros for off-by-one, or
    None), ``packing`` (0 none, 1 padded right, 2 padded left, 3 packed ``thd``) with the
    per-sequence lengths; masks apply in each sequence's own coordinates. ``padded_mask``: the
    padded batch's ``_padded_mask``, made once by the caller (None: made here)."""
    acc = _acc_dtype(q.dtype)
    if packing == 3:
        return _math_forward_packed(q, k, v, mask_args, scale, softcap, sink, lens_q, lens_kv)
    qh, kh, vh = (_to_bhsd(t, layout).to(acc) for t in (q, k, v))
    kh, vh = _heads(kh, vh, qh.shape[1])
    if packing:
        allowed = padded_mask if padded_mask is not None else _padded_mask(
            mask_args, packing, lens_q, lens_kv, qh.shape[2], kh.shape[2], q.device)
    else:
        allowed = _mask_bool(mask_args, qh.shape[2], kh.shape[2], q.device)
    o, lse = _attend(qh, kh, vh, allowed, scale, softcap, sink)
    return _from_bhsd(o.to(q.dtype), layout), lse.to(lse_dtype(q.dtype))


def _math_forward_packed(q, k, v, mask_args, scale, softcap, sink, lens_q, lens_kv):
    """Packed ``thd`` sequences ``[t, h, d]``, one at a time (no ``t_q x t_kv`` scores): O
    ``[t_q, h_q, d_v]`` and the LSE ``[1, h_q, t_q]``."""
    acc = _acc_dtype(q.dtype)
    hq = q.shape[1]
    outs, lses = [], []
    q0 = k0 = 0
    for lq, lkv in zip(lens_q, lens_kv):
        if lq:
            qh = q[q0:q0 + lq].transpose(0, 1).unsqueeze(0).to(acc)
            kh, vh = (t[k0:k0 + lkv].transpose(0, 1).unsqueeze(0).to(acc) for t in (k, v))
            kh, vh = _heads(kh, vh, hq)
            # No key at all: every row empty (the mask of an empty rectangle admits nothing).
            allowed = (_mask_bool(mask_args, lq, lkv, q.device) if lkv else
                       torch.zeros(lq, 0, dtype=torch.bool, device=q.device))
            o, lse = _attend(qh, kh, vh, allowed, scale, softcap, sink)
            outs.append(o[0].transpose(0, 1))
            lses.append(lse)
        q0, k0 = q0 + lq, k0 + lkv
    o = torch.cat(outs, 0).to(q.dtype)
    return o, torch.cat(lses, -1).to(lse_dtype(q.dtype))


def _sink_logits(learnable: bool, hq: int, sink, device) -> Optional[torch.Tensor]:
    """A learnable call's sink logits as the executors read them (fp32, contiguous ``[h_q]``),
    or None. A learnable call without them is refused, never run as a vanilla softmax; logits
    given to a call whose softmax is not learnable are refused too."""
    if not learnable:
        if sink is not None:
            raise InvalidInput("sink logits given for a call whose softmax is not learnable")
        return None
    if sink is None:
        raise InvalidInput("a learnable softmax needs the sink logits (a [h_q] tensor)")
    if tuple(sink.shape) != (hq,) or not sink.is_floating_point() or sink.device != device:
        raise InvalidInput(f"sink must be a floating-point [{hq}] tensor on {device}; found "
                           f"{sink.dtype} {tuple(sink.shape)} on {sink.device}")
    return sink.detach().to(_F32).contiguous()


class _MathRunner(_Runner):
    """``torch_math``: every feature (soft-capping, both sinks, padded and packed sequences);
    the backward is autograd through the same math (d_sink included, in the sink's dtype)."""

    executor = "torch_math"

    def __init__(self, call: _Call):
        self.layout, self.scale = call.layout, call.scale
        self.mask_args = (call.mask, call.window_left, call.window_right, call.bottom_right)
        self.softcap, self.softmax, self.hq = call.softcap, call.softmax, call.hq
        self.packing, self.lens_q, self.lens_kv = call.packing, call.seqlens_q, call.seqlens_kv
        self.acc = _acc_dtype(call.dtype)
        self.sq, self.skv = call.sq, call.skv
        # A padded batch's mask, made on the first call (its lengths are copied to the device
        # once, not on every call: nothing a CUDA graph capture of a later call could not take).
        self._padded: Optional[torch.Tensor] = None

    def _sink(self, sink, device):
        """The sink logits in the accumulation dtype (read as fp32, as every executor reads
        them; off-by-one: zeros), or None for a vanilla softmax."""
        s32 = _sink_logits(self.softmax == LEARNABLE, self.hq, sink, device)
        if s32 is not None:
            return s32.to(self.acc)
        if self.softmax:
            return torch.zeros(self.hq, dtype=self.acc, device=device)
        return None

    def _run(self, q, k, v, sink):
        if self.packing in (1, 2) and (self._padded is None or self._padded.device != q.device):
            self._padded = _padded_mask(self.mask_args, self.packing, self.lens_q, self.lens_kv, self.sq, self.skv,
                                        q.device)
        return _math_forward(q, k, v, self.layout, self.mask_args, self.scale, self.softcap, sink, self.packing,
                             self.lens_q, self.lens_kv, self._padded)

    def forward(self, q, k, v, sink=None):
        o, lse = self._run(q, k, v, self._sink(sink, q.device))
        return o.contiguous(), lse.contiguous()

    def backward(self, g, q, k, v, o, lse, sink=None):
        s = self._sink(sink, q.device)
        learnable = self.softmax == LEARNABLE
        with torch.enable_grad():
            qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
            leaves = (qq, kk, vv)
            if learnable:
                s = s.requires_grad_(True)
                leaves += (s,)
            out, _ = self._run(qq, kk, vv, s)
            # (allow_unused: packed keys whose sequences have no query rows are never read.)
            grads = torch.autograd.grad(out, leaves, g, allow_unused=True)
        grads = [torch.zeros_like(t) if d is None else d for t, d in zip(leaves, grads)]
        dqkv = _restrided(grads[:3], (q, k, v))
        if not learnable:
            return dqkv
        # d_sink as the other executors return it: fp32, then the sink's dtype.
        return (*dqkv, grads[3].to(_F32).to(sink.dtype))


class _SdpaFallback(_Runner):
    """``on_decline="fallback"``: torch SDPA (math-equivalent masks), recomputed for the
    backward. Its log-sum-exp is not computed (NaN)."""

    executor = "torch_sdpa_fallback"

    def __init__(self, call: _Call):
        self.layout, self.scale, self.dropout_p = call.layout, call.scale, call.dropout_p
        self.mask_args = (call.mask, call.window_left, call.window_right, call.bottom_right)
        self.lse_shape = (call.b, call.hq, call.sq)
        self.lse_dtype = lse_dtype(call.dtype)

    def _sdpa(self, q, k, v):
        qh, kh, vh = (_to_bhsd(t, self.layout) for t in (q, k, v))
        allowed = _mask_bool(self.mask_args, qh.shape[2], kh.shape[2], q.device)
        o = F.scaled_dot_product_attention(
            qh, kh, vh, attn_mask=allowed, dropout_p=self.dropout_p, scale=self.scale,
            enable_gqa=qh.shape[1] != kh.shape[1],
        )
        return _from_bhsd(o, self.layout)

    def forward(self, q, k, v, sink=None):
        o = self._sdpa(q, k, v).contiguous()
        return o, torch.full(self.lse_shape, float("nan"), dtype=self.lse_dtype, device=q.device)

    def backward(self, g, q, k, v, o, lse, sink=None):
        with torch.enable_grad():
            qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
            grads = torch.autograd.grad(self._sdpa(qq, kk, vv), (qq, kk, vv), g)
        return _restrided(grads, (q, k, v))

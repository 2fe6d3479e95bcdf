"""attn-policy FROST bridge (embedded by adapters/src/frost/bridge.rs). Builds cuDNN frontend
pygraphs from each tensor's actual strides, lists the ranked plans (names + engine ids), pins
the plan the Rust side selected by name, and executes on the stream bound per call."""
import os
import sys

ENV = "CUDNN_FRONTEND_ENABLE_FROST_ENGINES"
_STATE = {"graphs": {}, "handles": {}}


def _on(v):
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def enable_and_import():
    # The engines are enabled before the import, as the frontend documents.
    if not _on(os.environ.get(ENV)):
        os.environ[ENV] = "1"
    import cudnn  # noqa: F401

    return _on(os.environ.get(ENV))


def versions():
    from importlib import metadata

    out = {}
    for dist, module in (("nvidia-cudnn-frontend", "cudnn"), ("nvidia-cutlass-dsl", "cutlass")):
        try:
            out[dist] = metadata.version(dist)
        except Exception:
            out[dist] = None
        if out[dist] is None and dist == "nvidia-cudnn-frontend":
            # a source install without distribution metadata: the module's own version
            try:
                out[dist] = str(__import__(module).__version__)
            except Exception:
                pass
    out["python"] = sys.version.split()[0]
    return out


class _P:
    __slots__ = ("p",)

    def __init__(self, p):
        self.p = int(p)

    def data_ptr(self):
        return self.p


def _handle(dev):
    h = _STATE["handles"].get(dev)
    if h is None:
        import cudnn

        h = cudnn.create_handle()
        _STATE["handles"][dev] = h
    return h


def _s4(s):
    return [int(s[0]), int(s[1]), int(s[2]), 1]


def _mask_kwargs(cudnn, left, right, bottom_right):
    kw = {"diagonal_alignment": cudnn.diagonal_alignment.BOTTOM_RIGHT if bottom_right else cudnn.diagonal_alignment.TOP_LEFT}
    if right is not None:
        kw["diagonal_band_right_bound"] = int(right)
    if left is not None:
        # cuDNN's left bound counts visible keys including the diagonal (minimum 1)
        kw["diagonal_band_left_bound"] = int(left) + 1
    return kw


def build(key, dev, backward, dims, dtype, strides, left, right, bottom_right, scale):
    """Returns [(plan name, engine id or None)] in rank order (heuristics mode A)."""
    import cudnn

    e = _STATE["graphs"].get(key)
    if e is not None:
        return e["names"]
    b, hq, hk, sq, skv, d, dv = dims
    io = cudnn.data_type.BFLOAT16 if dtype == "bf16" else cudnn.data_type.HALF
    f32 = cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=f32, compute_data_type=f32, handle=_handle(dev))
    qs, ks, vs, os_ = strides
    q = g.tensor(name="q", dim=[b, hq, sq, d], stride=_s4(qs), data_type=io)
    k = g.tensor(name="k", dim=[b, hk, skv, d], stride=_s4(ks), data_type=io)
    v = g.tensor(name="v", dim=[b, hk, skv, dv], stride=_s4(vs), data_type=io)
    stats_dim, stats_stride = [b, hq, sq, 1], [hq * sq, sq, 1, 1]
    kw = _mask_kwargs(cudnn, left, right, bottom_right)
    if not backward:
        o, st = g.sdpa(name="sdpa", q=q, k=k, v=v, generate_stats=True, attn_scale=float(scale), **kw)
        o.set_output(True).set_dim([b, hq, sq, dv]).set_stride(_s4(os_)).set_data_type(io)
        st.set_output(True).set_dim(stats_dim).set_stride(stats_stride).set_data_type(f32)
        tensors = (q, k, v, o, st)
    else:
        o = g.tensor(name="o", dim=[b, hq, sq, dv], stride=_s4(os_), data_type=io)
        do = g.tensor(name="dO", dim=[b, hq, sq, dv], stride=_s4(os_), data_type=io)
        st = g.tensor(name="stats", dim=stats_dim, stride=stats_stride, data_type=f32)
        dq, dk, dvv = g.sdpa_backward(name="sdpa_bwd", q=q, k=k, v=v, o=o, dO=do, stats=st, attn_scale=float(scale),
                                      use_deterministic_algorithm=False, **kw)
        dq.set_output(True).set_dim([b, hq, sq, d]).set_stride(_s4(qs)).set_data_type(io)
        dk.set_output(True).set_dim([b, hk, skv, d]).set_stride(_s4(ks)).set_data_type(io)
        dvv.set_output(True).set_dim([b, hk, skv, dv]).set_stride(_s4(vs)).set_data_type(io)
        tensors = (q, k, v, o, do, st, dq, dk, dvv)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A])
    names = []
    for i in range(g.get_execution_plan_count()):
        name = str(g.get_plan_name_at_index(i))
        try:
            eid = int(g.get_engine_and_knobs_at_index(i)[0])
        except Exception:
            eid = None
        names.append((name, eid))
    _STATE["graphs"][key] = {"g": g, "names": names, "t": tensors, "built": None}
    return names


def select(key, index):
    """Pins (strictly) and builds the plan the Rust side chose by name; returns workspace bytes."""
    e = _STATE["graphs"][key]
    if e["built"] != index:
        e["g"].select_plan(int(index))
        e["g"].build_plans()
        e["built"] = index
    return int(e["g"].get_workspace_size())


def execute(key, dev, ptrs, workspace, stream):
    import cudnn

    e = _STATE["graphs"][key]
    h = _handle(dev)
    cudnn.set_stream(h, int(stream))  # the caller's stream, bound on every call
    pack = {t: _P(p) for t, p in zip(e["t"], ptrs)}
    e["g"].execute(pack, _P(workspace), handle=h)

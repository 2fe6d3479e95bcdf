"""The C++ autograd node of eager calls (``attn_policy.eager_node``) on CPU tensors.

Both nodes call the same plans, so their results must be equal bit for bit; the C++ one is
built here with the compiler found (skipped, with the reason, where there is none)."""

import gc
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import attn_policy.torch as apt  # noqa: E402
from attn_policy import eager_node  # noqa: E402

needs_cxx = pytest.mark.skipif(eager_node.compiler() is None, reason="no C++ compiler ($CXX, c++, g++) here")


@pytest.fixture
def node(eager_node_mode):
    return eager_node_mode


def _inputs(case, seed):
    """(the tensor to differentiate for, [q, k, v]): Q, K, V are leaves, or views of one
    packed leaf (strides that are not contiguous)."""
    layout, dtype, b, hq, hkv, sq, skv, d, packed = case
    g = torch.Generator().manual_seed(seed)
    if packed:
        assert layout == "bshd" and hq == hkv and sq == skv
        qkv = torch.randn(b, sq, 3, hq, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True)
        return (qkv,), list(qkv.unbind(2))

    def make(h, s):
        shape = {"bhsd": (b, h, s, d), "bshd": (b, s, h, d), "sbhd": (s, b, h, d)}[layout]
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True)

    q, k, v = make(hq, sq), make(hkv, skv), make(hkv, skv)
    return (q, k, v), [q, k, v]


CASES = [
    # layout, dtype, b, hq, hkv, sq, skv, d, packed
    ("bhsd", torch.float64, 2, 4, 2, 7, 9, 16, False),
    ("bshd", torch.float32, 1, 3, 3, 5, 5, 8, True),
    ("sbhd", torch.bfloat16, 2, 6, 2, 8, 6, 32, False),
    ("bshd", torch.float16, 1, 4, 1, 6, 11, 24, False),
]
MASKS = [dict(is_causal=True), dict(is_causal=True, diagonal="bottom_right", window=(3, 0)), dict(window=(2, 1))]


def _run(case, mask, seed):
    wrt, (q, k, v) = _inputs(case, seed)
    o = apt.attention(q, k, v, layout=case[0], **mask)
    g = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype)
    with torch.no_grad():  # the forward without a node
        o_no_grad = apt.attention(q, k, v, layout=case[0], **mask)
    assert o_no_grad.grad_fn is None
    return o, torch.autograd.grad(o, wrt, do) + (o_no_grad,), type(o.grad_fn).__name__


@needs_cxx
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{str(c[1])[6:]}-{'packed' if c[8] else 'gqa'}")
@pytest.mark.parametrize("mask", MASKS, ids=["causal", "br-window", "window"])
def test_cpp_node_equals_the_python_node_bitwise(node, case, mask):
    node("python")
    o_py, g_py, fn_py = _run(case, mask, 5)
    node("cpp")
    o_cpp, g_cpp, fn_cpp = _run(case, mask, 5)
    assert fn_py == "_EagerBackward"
    assert fn_cpp != fn_py, fn_cpp  # the C++ node really ran
    assert eager_node.status()["node"] == "cpp"
    assert torch.equal(o_py, o_cpp)
    for a, b in zip(g_py, g_cpp):  # gradients, then O without grad
        assert torch.equal(a, b)
        assert not torch.isnan(a).any()
    assert torch.equal(g_cpp[-1], o_cpp)
    # A second call with the same signature (the cached plan) gives the same again.
    o2, g2, _ = _run(case, mask, 5)
    assert torch.equal(o2, o_cpp) and all(torch.equal(a, b) for a, b in zip(g2, g_cpp))


@needs_cxx
def test_cpp_node_gradcheck_in_float64(node):
    node("cpp")
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    o = apt.attention(q, k, v, is_causal=True)
    assert type(o.grad_fn).__name__ != "_EagerBackward"
    assert torch.autograd.gradcheck(lambda a, b, c: apt.attention(a, b, c, is_causal=True), (q, k, v),
                                    eps=1e-6, atol=1e-8)


@needs_cxx
def test_cpp_node_keeps_its_plan_after_the_cache_is_cleared(node):
    node("cpp")
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    do = torch.randn(1, 2, 6, 8, generator=g, dtype=torch.float64)
    o = apt.attention(q, k, v, is_causal=True)
    want = torch.autograd.grad(apt.attention(q, k, v, is_causal=True), (q, k, v), do)
    apt.clear_cache()  # drops the Python objects that made the plan
    gc.collect()
    got = torch.autograd.grad(o, (q, k, v), do)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@needs_cxx
def test_cpp_node_takes_any_strides_of_the_output_gradient(node):
    node("cpp")
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    o = apt.attention(q, k, v)
    do = torch.randn(2, 5, 3, 8, generator=g, dtype=torch.float64).transpose(1, 2)  # not O's strides
    got = torch.autograd.grad(o, (q, k, v), do)
    node("python")
    o_py = apt.attention(q, k, v)
    want = torch.autograd.grad(o_py, (q, k, v), do)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@needs_cxx
def test_cpp_node_refuses_double_backward(node):
    node("cpp")
    q, k, v = (torch.randn(1, 2, 4, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    o = apt.attention(q, k, v, is_causal=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(o.sum(), (q, k, v), create_graph=True)


def test_errors_of_the_node_are_retyped():
    e = apt._retyped(RuntimeError("attn_policy[ExecutorRefused]: head dim 999 is not supported"))
    assert isinstance(e, attn_policy_native().ExecutorRefused) and str(e) == "head dim 999 is not supported"
    e = apt._retyped(RuntimeError("attn_policy[InvalidInput]: bad strides"))
    assert type(e) is apt.InvalidInput and isinstance(e, ValueError) and str(e) == "bad strides"
    other = RuntimeError("CUDA error: out of memory")
    assert apt._retyped(other) is other


def attn_policy_native():
    from attn_policy import _native

    return _native


def _fresh_process(tmp_path, mode, code, **env_vars):
    """Runs ``code`` in a new Python (this one may have loaded the node already), by default
    with no compiler to be found and an empty cache."""
    env = dict(os.environ, CXX=str(tmp_path / "no-such-compiler"), ATTN_POLICY_CACHE_DIR=str(tmp_path / "cache"),
               ATTN_POLICY_EAGER_NODE=mode)
    env.update(env_vars)
    prelude = ("import warnings, torch, attn_policy.torch as apt\n"
               "from attn_policy import eager_node\n"
               "q, k, v = (torch.randn(1, 2, 4, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))\n")
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, env=env, timeout=300)


def test_mode_cpp_without_a_compiler_is_an_error(tmp_path):
    r = _fresh_process(tmp_path, "cpp", (
        "try:\n"
        "    apt.attention(q, k, v, is_causal=True)\n"
        "except eager_node.EagerNodeError as e:\n"
        "    print('refused:', e)\n"))
    assert r.returncode == 0, r.stderr
    assert "refused: no C++ compiler found" in r.stdout, r.stdout
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.so"))


def test_mode_auto_without_a_compiler_warns_and_uses_python(tmp_path):
    r = _fresh_process(tmp_path, "auto", (
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    o = apt.attention(q, k, v, is_causal=True)\n"
        "print('grad_fn:', type(o.grad_fn).__name__)\n"
        "print('warned:', [str(x.message) for x in w if x.category is RuntimeWarning])\n"
        "print('warned at:', [(x.filename, x.lineno) for x in w if x.category is RuntimeWarning])\n"
        "print('status:', eager_node.status())\n"
        "o.sum().backward()\n"
        "print('grad ok:', bool(torch.isfinite(q.grad).all()))\n"))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "grad_fn: _EagerBackward" in out, out
    assert "Python autograd.Function" in out and "no C++ compiler found" in out, out
    warned = next(ln for ln in out.splitlines() if ln.startswith("warned:"))
    # One warning of one line, which says how to silence it.
    assert "\\n" not in warned, warned
    assert "ATTN_POLICY_EAGER_NODE=python" in warned, warned
    # It names the caller's line (the -c script's sixth: the attention call), not attn_policy's.
    at = next(ln for ln in out.splitlines() if ln.startswith("warned at:"))
    assert at == "warned at: [('<string>', 6)]", at
    assert "'node': 'python'" in out and "grad ok: True" in out, out
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.so"))


@pytest.mark.skipif(not os.path.exists("/bin/false"), reason="no /bin/false")
def test_a_failing_compiler_is_reported_with_its_command(tmp_path):
    r = _fresh_process(tmp_path, "cpp", (
        "try:\n"
        "    apt.attention(q, k, v, is_causal=True)\n"
        "except eager_node.EagerNodeError as e:\n"
        "    print('refused:', e)\n"), CXX="/bin/false")
    assert r.returncode == 0, r.stderr
    assert "refused: compiling eager_node.cpp for torch" in r.stdout and "failed (exit 1" in r.stdout, r.stdout
    # The message is one line naming the log; the log holds the command and the output.
    assert r.stdout.count("\n") == 1, r.stdout
    logs = list((tmp_path / "cache").rglob("build.log"))
    assert len(logs) == 1 and str(logs[0]) in r.stdout, (logs, r.stdout)
    log = logs[0].read_text()
    assert "$ /bin/false " in log and "exit 1" in log, log
    assert not any((tmp_path / "cache").rglob("*.so"))


def test_a_compiler_error_is_one_line_and_the_whole_output_is_in_the_log(tmp_path):
    # A compiler that fails as a real one does: pages of diagnostics, the cause at the top.
    cxx = tmp_path / "fake-cxx"
    cxx.write_text("#!/bin/sh\necho 'eager_node.cpp:1:2: error: #error C++99 is required' >&2\n"
                   "i=0; while [ $i -lt 300 ]; do echo \"note: candidate $i\" >&2; i=$((i+1)); done\nexit 1\n")
    cxx.chmod(0o755)
    r = _fresh_process(tmp_path, "auto", (
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    o = apt.attention(q, k, v, is_causal=True)\n"
        "msgs = [str(x.message) for x in w if x.category is RuntimeWarning]\n"
        "print(len(msgs)); print(msgs[0])\n"), CXX=str(cxx))
    assert r.returncode == 0, r.stderr
    count, message = r.stdout.splitlines()[:2]
    assert count == "1" and len(r.stdout.splitlines()) == 2, r.stdout
    assert "error: #error C++99 is required" in message and "candidate" not in message, message
    assert "ATTN_POLICY_EAGER_NODE=python" in message and "build.log" in message, message
    log = next((tmp_path / "cache").rglob("build.log")).read_text()
    assert "note: candidate 299" in log and "error: #error C++99" in log, log[:500]


def test_the_cxx_standard_is_the_one_this_torch_requires():
    std = eager_node.cxx_standard()
    # torch 2.11's headers need C++17, 2.15's C++20 (they #error under C++17): CI runs both.
    known = {"2.11": "c++17", "2.15": "c++20"}
    assert std == known.get(".".join(torch.__version__.split(".")[:2]), std), std
    assert f"-std={std}" in eager_node._command("c++", eager_node.SOURCE)


@needs_cxx
def test_an_unwritable_cache_falls_back_with_the_reason(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    r = _fresh_process(tmp_path, "auto", (
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    o = apt.attention(q, k, v, is_causal=True)\n"
        "print('grad_fn:', type(o.grad_fn).__name__)\n"
        "print('warned:', [str(x.message) for x in w if x.category is RuntimeWarning])\n"),
        CXX=eager_node.compiler(), ATTN_POLICY_CACHE_DIR=str(blocker))
    assert r.returncode == 0, r.stderr
    assert "grad_fn: _EagerBackward" in r.stdout, r.stdout
    assert "cannot build into" in r.stdout and "ATTN_POLICY_CACHE_DIR" in r.stdout, r.stdout


def test_mode_python_never_builds(node, monkeypatch, tmp_path):
    monkeypatch.setenv("ATTN_POLICY_CACHE_DIR", str(tmp_path))
    node("python")
    q, k, v = (torch.randn(1, 2, 4, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    o = apt.attention(q, k, v, is_causal=True)
    assert type(o.grad_fn).__name__ == "_EagerBackward"
    assert eager_node.status() == {"mode": "python", "node": "python", "detail": "ATTN_POLICY_EAGER_NODE=python"}
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_mode_is_refused(node, monkeypatch):
    node("fast")
    q, k, v = (torch.randn(1, 2, 4, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    with pytest.raises(eager_node.EagerNodeError, match="expected one of auto, cpp, python"):
        apt.attention(q, k, v, is_causal=True)


@needs_cxx
def test_command_line_builds_and_reports(tmp_path):
    env = dict(os.environ, ATTN_POLICY_EAGER_NODE="auto")
    r = subprocess.run([sys.executable, "-m", "attn_policy.eager_node", "--build", "--json"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["node"] == "cpp" and os.path.isfile(s["detail"]), s
    r = subprocess.run([sys.executable, "-m", "attn_policy.eager_node", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--build" in r.stdout
    # This process finds the library the command built (the same cache path).
    assert str(eager_node.library_path()) == s["detail"]

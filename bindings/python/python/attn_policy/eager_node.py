"""The C++ autograd node of eager ``attn_policy.torch.attention`` calls, built on first use.

Why: torch runs a backward written in Python on autograd's device thread under the GIL; on
the H200 a trivial Python ``torch.autograd.Function`` alone costs 70-80 µs per forward +
backward, more than half of SDPA's whole eager call. ``csrc/eager_node.cpp`` is the same node
in C++ (a ``torch::autograd::Function`` whose forward and backward call the executors' plans
through a C ABI of ``attn_policy._native``), so the backward runs without Python.

It cannot ship prebuilt in this wheel: the wheel is one build for every torch version, and a
C++ node must be compiled against the torch in the process. So it is compiled here, once per
torch version and source (about 15 s), with the C++ compiler found (``$CXX``, ``c++``,
``g++``), the C++ standard that torch's headers require (C++17 for torch 2.11, C++20 for
2.15: read from ``ATen/ATen.h``) and torch's headers and libraries (no CUDA toolkit needed),
and cached in
``$ATTN_POLICY_CACHE_DIR`` (default ``$XDG_CACHE_HOME/attn-policy`` or
``~/.cache/attn-policy``) under ``eager-node/``. Concurrent processes (``torchrun`` ranks)
wait on a file lock; one compiles.

``ATTN_POLICY_EAGER_NODE`` chooses:

- ``auto`` (default): the C++ node, built on the first eager call of a built-in executor; if no
  compiler is found or the build fails, one ``RuntimeWarning`` line (what failed, the build log
  holding the compiler's whole output, how to silence it) and the Python ``autograd.Function``
  (same executors, same results, more host time);
- ``cpp``: the C++ node or an error (``EagerNodeError``);
- ``python``: never build; the Python ``autograd.Function``.

Only the eager direct path uses it (calls without gradients too: its forward allocates O and
the LSE in C++, cheaper than from Python). ``torch.compile`` and calls under dispatch or function
modes go through ``torch.ops.attn_policy.attention`` (autograd registered in Python), which
tracing needs.

Command line::

    python -m attn_policy.eager_node           # what eager calls use here, and why
    python -m attn_policy.eager_node --build   # build (or find) the node now, e.g. in a Dockerfile
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import torch

from . import _native

__all__ = ["EagerNodeError", "Node", "op", "status", "build", "build_log", "cxx_standard", "reset",
           "library_path", "MODES"]

log = logging.getLogger("attn_policy")

SOURCE = Path(__file__).with_name("csrc") / "eager_node.cpp"
MODES = ("auto", "cpp", "python")
ENV = "ATTN_POLICY_EAGER_NODE"


class EagerNodeError(RuntimeError):
    """The C++ node cannot be built or loaded (with ``ATTN_POLICY_EAGER_NODE=cpp``)."""


def mode() -> str:
    m = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if m not in MODES:
        raise EagerNodeError(f"{ENV}={m!r}: expected one of {', '.join(MODES)}")
    return m


def cache_dir() -> Path:
    root = os.environ.get("ATTN_POLICY_CACHE_DIR")
    if root:
        return Path(root) / "eager-node"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "attn-policy" / "eager-node"


def compiler() -> Optional[str]:
    """The C++ compiler: ``$CXX``, else ``c++`` or ``g++`` on PATH."""
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx) or (cxx if os.path.isfile(cxx) else None)
    return shutil.which("c++") or shutil.which("g++")


def _torch_dirs() -> Dict[str, Any]:
    root = Path(torch.__file__).parent
    return {"include": [root / "include", root / "include" / "torch" / "csrc" / "api" / "include"],
            "lib": root / "lib"}


# `__cplusplus` values and the -std flag that gives each.
_STANDARDS = ((201703, "c++17"), (202002, "c++20"), (202302, "c++23"))


def cxx_standard() -> str:
    """The ``-std`` the torch in the process requires of code including its headers: the check
    ``__cplusplus < N`` at the top of ``ATen/ATen.h`` (torch 2.11: C++17; 2.15: C++20, whose
    headers do not compile as C++17). The oldest standard meeting it; C++17 where the header
    states none."""
    import re

    try:
        text = (_torch_dirs()["include"][0] / "ATen" / "ATen.h").read_text(errors="replace")[:4000]
    except OSError:
        return "c++17"
    need = max((int(n) for n in re.findall(r"__cplusplus\s*<\s*(\d{6})L", text)), default=0)
    for value, flag in _STANDARDS:
        if value >= need:
            return flag
    return _STANDARDS[-1][1]


def _command(cxx: str, out: Path) -> List[str]:
    d = _torch_dirs()
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    cmd = [cxx, "-O2", f"-std={cxx_standard()}", "-shared", "-fPIC",
           f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    for inc in d["include"]:
        cmd += ["-isystem", str(inc)]
    cmd += [str(SOURCE), "-o", str(out), f"-L{d['lib']}", "-lc10", "-ltorch_cpu",
            f"-Wl,-rpath,{d['lib']}"]
    return cmd


def library_path(cxx: Optional[str] = None) -> Path:
    """Where the node for this torch, source and compiler is (or will be) cached."""
    cxx = cxx or compiler() or "c++"
    h = hashlib.sha256()
    h.update(SOURCE.read_bytes())
    h.update(torch.__version__.encode())
    h.update(" ".join(_command(cxx, Path("out"))).encode())
    h.update(str(_native.plan_abi()[1]).encode())
    tag = torch.__version__.replace("+", "_")
    return cache_dir() / f"torch-{tag}-{h.hexdigest()[:16]}" / "libattn_policy_eager.so"


def build(force: bool = False) -> Path:
    """Compiles the node (unless cached) and returns its path; ``EagerNodeError`` says why not."""
    if not sys.platform.startswith("linux"):
        raise EagerNodeError(f"the C++ node is built on Linux only (this is {sys.platform})")
    cxx = compiler()
    if cxx is None:
        raise EagerNodeError("no C++ compiler found ($CXX, c++, g++)")
    if not SOURCE.is_file():
        raise EagerNodeError(f"the node's source is missing from the package: {SOURCE}")
    out = library_path(cxx)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out.parent / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one rank compiles; the others find its result
            if out.is_file() and not force:
                return out
            _compile(cxx, out)
    except OSError as e:
        raise EagerNodeError(f"cannot build into {out.parent} ({e}); set ATTN_POLICY_CACHE_DIR "
                             f"to a writable directory") from e
    return out


def build_log(out: Path) -> Path:
    """Where the compiler's whole output for the node at ``out`` is written."""
    return out.parent / "build.log"


def _first_error(text: str) -> str:
    """The line that says what failed (the first error), shortened: the warning's summary."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "no output")
    return line if len(line) <= 240 else line[:237] + "..."


def _compile(cxx: str, out: Path) -> None:
    log.warning("attn_policy: compiling the C++ autograd node for torch %s (once; ~15 s) into %s",
                torch.__version__, out)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = _command(cxx, Path(tmp))
    logfile = build_log(out)

    def record(status: str, output: str) -> None:
        logfile.write_text(f"torch {torch.__version__}, {SOURCE}\n$ {' '.join(cmd)}\n{status}\n{output}"
                           + ("" if output.endswith("\n") else "\n"))

    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as e:
        os.unlink(tmp)
        record("timed out after 900 s", f"{e.stdout or ''}{e.stderr or ''}")
        raise EagerNodeError(f"compiling {SOURCE.name} took over 900 s (build log: {logfile})") from None
    except OSError as e:
        os.unlink(tmp)
        raise EagerNodeError(f"running the compiler {cxx} failed: {e}") from e
    output = (r.stdout or "") + (r.stderr or "")
    record(f"exit {r.returncode}", output)
    if r.returncode != 0:
        os.unlink(tmp)
        raise EagerNodeError(f"compiling {SOURCE.name} for torch {torch.__version__} failed "
                             f"(exit {r.returncode}: {_first_error(output)}); the compiler's output "
                             f"is in {logfile}")
    os.replace(tmp, out)


class Node(NamedTuple):
    """The node's ops; ``plan`` is a ``NativePlan.handle`` whose plan matches the tensors."""

    attention: Callable  # (q, k, v, plan) -> O, differentiable in q, k, v
    forward: Callable  # (q, k, v, plan) -> O, for a call that needs no gradient


_lock = threading.Lock()
_state: Dict[str, Any] = {}


def _load() -> Node:
    if "loaded" in _state:
        # A process loads the node once: its op namespace cannot be registered twice.
        return _state["loaded"]
    path = build()
    try:
        torch.ops.load_library(str(path))
        address, version = _native.plan_abi()
        torch.ops.attn_policy_eager.set_abi(address, version)
        ops = torch.ops.attn_policy_eager
        # The overloads' C++ callables, without OpOverload.__call__'s Python frame.
        node = Node(*(getattr(o, "_op", o) for o in (ops.attention.default, ops.forward.default)))
    except (OSError, RuntimeError, AttributeError) as e:
        raise EagerNodeError(f"loading {path} failed: {e}") from e
    _state["path"] = str(path)
    _state["loaded"] = node
    return node


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside this package, for a warning raised in
    ``op()``: it names the user's line that made the first eager call, however deep inside
    attn_policy the node was asked for."""
    pkg = str(Path(__file__).resolve().parent)
    frame, level = sys._getframe(2), 2  # 1 is op(), which warns
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(pkg):
        frame, level = frame.f_back, level + 1
    return level


def op() -> Optional[Node]:
    """The node's ops, or None where eager calls use the Python ``autograd.Function`` and the
    Python forward (mode ``python``, or ``auto`` without a usable compiler). Built and loaded on
    the first call."""
    if "op" in _state:
        return _state["op"]
    with _lock:
        if "op" in _state:
            return _state["op"]
        m = mode()
        fn = None
        if m == "python":
            _state["why"] = f"{ENV}=python"
        else:
            try:
                fn = _load()
            except EagerNodeError as e:
                if m == "cpp":
                    raise
                why = " ".join(str(e).split())  # one line, whatever the reason holds
                _state["why"] = why
                warnings.warn(f"attn_policy: the C++ eager node is not used ({why}); eager calls use "
                              f"the Python autograd.Function (same results, more host time per "
                              f"backward); set {ENV}=python to silence this", RuntimeWarning,
                              stacklevel=_caller_level())
        _state["op"] = fn
        return fn


def reset() -> None:
    """Forgets the choice (``ATTN_POLICY_EAGER_NODE`` is read again by the next plan made); a node once loaded stays the process's node (``$CXX`` or the cache directory
    changed later are not looked at again). ``attn_policy.torch.clear_cache()`` calls it."""
    with _lock:
        _state.pop("op", None)
        _state.pop("why", None)


def status() -> Dict[str, Any]:
    """What eager calls use: ``{"mode", "node": "cpp" | "python" | "not loaded yet", "detail"}``."""
    m = os.environ.get(ENV, "auto")
    if "op" not in _state:
        return {"mode": m, "node": "not loaded yet",
                "detail": f"would build into {library_path()}" if compiler() else "no C++ compiler found"}
    if _state["op"] is None:
        return {"mode": m, "node": "python", "detail": _state.get("why", "")}
    return {"mode": m, "node": "cpp", "detail": _state["path"]}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m attn_policy.eager_node",
        description="The C++ autograd node of eager attn_policy.torch.attention calls: "
                    "say what is used here, or build it now.")
    ap.add_argument("--build", action="store_true", help="build (or find) and load the node now")
    ap.add_argument("--force", action="store_true", help="with --build: compile even if cached")
    ap.add_argument("--json", action="store_true", help="print the status as JSON")
    a = ap.parse_args(argv)
    rc = 0
    if a.build:
        try:
            if a.force:
                build(force=True)
            if op() is None:
                rc = 1
        except EagerNodeError as e:
            print(f"error: {e}", file=sys.stderr)
            rc = 1
    s = status()
    print(json.dumps(s) if a.json else f"eager node: {s['node']} (mode {s['mode']}): {s['detail']}")
    return rc


if __name__ == "__main__":
    sys.exit(main())

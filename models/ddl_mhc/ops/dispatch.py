"""The one rule that chooses how an op runs (docs/ddl_mhc.md, 'Choosing a path'), from the tensors alone, as
flash-linear-attention's layers do:

- "triton": the op's Triton kernel, when triton is installed, no torch.compile / export is tracing, every
  tensor is on a CUDA device and the data tensor has a dtype the kernel computes in;
- "node": the op's autograd node with a hand-written backward otherwise (its forward alone when no input
  needs a gradient, `run_node`), and always while torch.compile / export or `torch.jit.trace` trace (a host
  path's Python floats would be baked into the trace as constants);
- "host": for an op that has one (the transport charts, `charts/host.py`; the hyper-connection with dynamic
  maps, `host_connection.py`), at most `host_rows` rows of CPU tensors that need no gradient, in eager mode:
  decoding on a CPU, where one row costs torch's per-op overhead many times over;
- "naive": the plain PyTorch reference (`naive.py`), only inside `ops_path("naive")` in eager mode.

Tests choose a path with the context manager `ops_path`: "naive" runs the references, "node" keeps the
kernels off CUDA tensors and the host path off CPU rows, "host" takes the host path at any row count (still
only without a gradient), and "triton" also sends CPU tensors to the kernels, which then run in Triton's
interpreter (`TRITON_INTERPRET=1`, read when the kernel modules are first imported). Tracing and the kernel's
dtypes still apply under "triton" (a float64 stream takes the node). This module never imports triton, so
it is safe to import without it.
"""

import contextlib
import importlib
import importlib.util
import os
from collections.abc import Iterator
from contextvars import ContextVar
from functools import cache
from typing import Literal, get_args

import torch

Path = Literal["naive", "node", "triton", "host"]
PATHS = get_args(Path)
STREAM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # the stream kernels accumulate in float32

_chosen: ContextVar[Path | None] = ContextVar("geoformers_ops_path", default=None)


@cache
def triton_available() -> bool:
    """Whether the `triton` package can be imported (looked up once, without importing it)."""
    return importlib.util.find_spec("triton") is not None


def interpreter_enabled() -> bool:
    """Whether `TRITON_INTERPRET=1` is set, so Triton kernels run on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def ops_path(path: Path) -> Iterator[None]:
    """Within this block every op prefers `path` (see the module docstring). "triton" raises RuntimeError when
    triton is missing or `TRITON_INTERPRET=1` is not set (CPU tensors could not run the kernels)."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if path == "triton" and not triton_available():
        raise RuntimeError("ops_path('triton') needs triton: pip install 'geoformers[triton]'")
    if path == "triton" and not interpreter_enabled():
        raise RuntimeError(
            "ops_path('triton') runs kernels on CPU tensors, which needs TRITON_INTERPRET=1 in the "
            "environment before the kernel modules are imported"
        )
    token = _chosen.set(path)
    try:
        yield
    finally:
        _chosen.reset(token)


def _needs_gradient(values) -> bool:
    """Whether autograd records an op on `values` (non-tensors ignored)."""
    return torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad for v in values)


def choose_path(
    data: torch.Tensor,
    *others: torch.Tensor | None,
    kernel_dtypes: tuple[torch.dtype, ...],
    host_rows: int = 0,
    rows: int | None = None,
) -> Path:
    """The path of an op on `data` (the tensor whose dtype the kernel computes in: streams, chart logits)
    and `others` (None entries ignored): the rule of the module docstring. `host_rows`: the most rows the op's
    host path takes (0: the op has none); `rows`: the op's rows (default: `data`'s first dimension)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():  # first: dynamo cannot trace a ContextVar
        return "node"
    chosen = _chosen.get()
    if chosen == "naive":
        return "naive"
    tensors = [tensor for tensor in (data, *others) if tensor is not None]
    if host_rows and chosen in (None, "host") and not _needs_gradient(tensors):
        rows = data.shape[0] if rows is None else rows
        if (chosen == "host" or rows <= host_rows) and all(tensor.is_cpu for tensor in tensors):
            return "host"
    if chosen in ("node", "host") or not triton_available():
        return "node"
    if data.dtype not in kernel_dtypes:
        return "node"
    devices = {tensor.device.type for tensor in tensors}
    if devices == {"cuda"} or (devices == {"cpu"} and chosen == "triton"):
        return "triton"
    return "node"


@cache
def _kernel_module(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:  # e.g. a flat Hub copy of the model without geoformers installed
        return None


def kernel(module: str, name: str):
    """The kernel function `name` of the module `module` (a full path, e.g.
    "geoformers.models.ddl_mhc.ops.charts.triton"), imported on first use, or None when that module cannot be
    imported (then the node runs): the models import without triton, and their flat Hub copies fall back
    to PyTorch."""
    found = _kernel_module(module)
    return None if found is None else getattr(found, name)


class _NoTape:
    """Stands in for the autograd context when a node's forward runs alone: nothing is saved."""

    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        pass

    def mark_non_differentiable(self, *tensors: torch.Tensor) -> None:
        pass


def run_node(node: type[torch.autograd.Function], *args):
    """`node.apply(*args)`, or its forward alone when no input needs a gradient (decoding, evaluation): the
    same outputs without building an autograd node (about 20 us per call on a CPU)."""
    if _needs_gradient(args):
        return node.apply(*args)
    return node.forward(_NoTape(), *args)

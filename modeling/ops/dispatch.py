"""When an op's Triton kernels replace its PyTorch paths (docs/ddl_mhc.md, 'One home per op').

`use_triton(*tensors)` is True when triton is installed (the optional extra `geoformers[triton]`) and
every tensor is on a CUDA device. On CPU tensors the kernels can only run in Triton's interpreter
(`TRITON_INTERPRET=1`, read when the kernel modules are first imported); `force_triton()` opts CPU
tensors in, for tests. This module never imports triton itself, so it is safe to import without it.
"""

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from contextvars import ContextVar
from functools import cache

import torch

_forced: ContextVar[bool] = ContextVar("geoformers_force_triton", default=False)


@cache
def triton_available() -> bool:
    """Whether the `triton` package can be imported (looked up once, without importing it)."""
    return importlib.util.find_spec("triton") is not None


def interpreter_enabled() -> bool:
    """Whether `TRITON_INTERPRET=1` is set, so Triton kernels run on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def force_triton() -> Iterator[None]:
    """Within this block `use_triton` is also True for CPU tensors (kernels run in Triton's interpreter).
    Raises RuntimeError when triton is missing or `TRITON_INTERPRET=1` is not set."""
    if not triton_available():
        raise RuntimeError("force_triton() needs triton: pip install 'geoformers[triton]'")
    if not interpreter_enabled():
        raise RuntimeError(
            "force_triton() runs kernels on CPU tensors, which needs TRITON_INTERPRET=1 in the environment "
            "before the kernel modules are imported"
        )
    token = _forced.set(True)
    try:
        yield
    finally:
        _forced.reset(token)


def use_triton(*tensors: torch.Tensor | None) -> bool:
    """True when the Triton kernels should run on `tensors` (None entries ignored): triton is installed and
    all of them are CUDA tensors, or (inside `force_triton()`) CPU tensors under the interpreter. False
    for no tensors."""
    tensors = tuple(tensor for tensor in tensors if tensor is not None)
    if not tensors or not all(isinstance(tensor, torch.Tensor) for tensor in tensors):
        return False  # not tensors: the PyTorch path's checks name the argument
    if not triton_available():
        return False
    devices = {tensor.device.type for tensor in tensors}
    if devices == {"cuda"}:
        return True
    return devices == {"cpu"} and _forced.get()


@cache
def _kernel_module(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:  # e.g. a flat Hub copy of the model without geoformers installed
        return None


def kernels(module: str, *tensors: torch.Tensor | None):
    """The kernel module `module` (a full path, e.g. "geoformers.modeling.ops.charts.triton") when its
    kernels should run on `tensors` in eager mode, else None (the PyTorch path runs). Under torch.compile the
    PyTorch path is traced and inductor generates its own kernels. The module is imported on first use, by
    name, so the models import without triton and their flat Hub copies fall back to PyTorch."""
    if torch.compiler.is_compiling() or not use_triton(*tensors):
        return None
    return _kernel_module(module)

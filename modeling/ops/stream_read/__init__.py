"""The stream read x_in = H_pre X and, with dynamic maps, the map terms it comes from (docs/ddl_mhc.md,
'Hyper-connections' and 'Fused sublayer'): `naive.py` is the plain PyTorch reference, `node.py` the autograd
nodes with hand-written backward passes, `triton.py` the kernel. The model calls the dispatchers below.

Which path runs, from `implementation` (`config.hc_implementation`) and the tensors alone:
"reference" always takes the naive functions; "fused" takes the Triton kernel on CUDA tensors in eager mode
(CPU tensors inside `force_triton()`, for tests), outside torch.compile and for float32 / bfloat16
streams, and the autograd node otherwise (its forward alone when no input needs a gradient).
"""

from collections.abc import Callable

import torch
from torch import nn

from geoformers.configuration.ddl_mhc import HC_IMPLEMENTATIONS
from geoformers.modeling.ops.dispatch import kernels
from geoformers.modeling.ops.stream_read.naive import (
    map_terms,
    naive_read_streams,
    naive_stream_maps,
    upcast,
)
from geoformers.modeling.ops.stream_read.node import StreamMapsRead, StreamRead, run_node

IMPLEMENTATIONS = HC_IMPLEMENTATIONS  # the config field `hc_implementation` takes the same values

__all__ = [
    "IMPLEMENTATIONS",
    "check_implementation",
    "map_terms",
    "read_streams",
    "stream_maps_read",
    "upcast",
]


def check_implementation(implementation: str) -> None:
    """A ValueError naming `implementation` unless it is one of IMPLEMENTATIONS."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")


def read_streams(weights: torch.Tensor, streams: torch.Tensor, implementation: str) -> torch.Tensor:
    """x_in = H_pre X: weights (n,) static or (..., n) per token, streams X (..., n, d) -> (..., d)."""
    check_implementation(implementation)
    if implementation == "reference":
        return naive_read_streams(weights, streams)
    triton = kernels("geoformers.modeling.ops.stream_read.triton", weights, streams)
    if triton is not None and streams.dtype != torch.float64:
        return triton.triton_read_streams(weights, streams)
    return run_node(StreamRead, weights.expand(*streams.shape[:-2], -1), streams)


def stream_maps_read(
    streams: torch.Tensor,
    projection: Callable[[torch.Tensor], torch.Tensor],
    pre_bias: torch.Tensor,
    pre_gate: torch.Tensor,
    eps: float,
    implementation: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(z, x_in): the dynamic map terms z = vec(X) W^T / rms(vec X) (..., m), at least float32, and the read
    x_in = softmax(b_pre + g_pre z[..., :n]) X (..., d). "fused" with `projection` a plain `nn.Linear` is
    one `StreamMapsRead` node; any other projection module (a PEFT LoRA wrapper) is called as it is, so its
    adapters act and get gradients, and only the read is fused."""
    check_implementation(implementation)
    if implementation == "fused" and type(projection) is nn.Linear:
        return run_node(StreamMapsRead, streams, projection.weight, pre_bias, pre_gate, eps)
    terms, weights = naive_stream_maps(streams, projection, pre_bias, pre_gate, eps)
    return terms, read_streams(weights, streams, implementation)

"""The stream writes (docs/ddl_mhc.md, 'Hyper-connections', 'The Deep Delta rule' and 'Fused sublayer'):
mix-and-write X' = H_res X + s u^T (mHC add) and the delta write X' = H_res X + beta (v - H_res X k) k^T
(DDL eq. 2.5). `naive.py` is the plain PyTorch reference, `node.py` the autograd nodes with hand-written
backward passes, `triton.py` the kernels. The model calls the dispatchers below, which choose the path as
the stream read's do (`geoformers.modeling.ops.stream_read`): "reference" -> naive; "fused" -> Triton on
CUDA tensors in eager mode for float32 / bfloat16 streams, else the autograd node.
"""

import torch

from geoformers.modeling.ops.dispatch import kernels
from geoformers.modeling.ops.stream_read import check_implementation
from geoformers.modeling.ops.stream_read.node import run_node
from geoformers.modeling.ops.stream_write.naive import naive_delta_write, naive_mix_and_write
from geoformers.modeling.ops.stream_write.node import AddMixWrite, DeltaMixWrite

__all__ = ["delta_write", "mix_and_write"]

TRITON = "geoformers.modeling.ops.stream_write.triton"


def _kernels(streams: torch.Tensor):
    """The write kernels' module when they run on `streams` (see `kernels`), else None."""
    return None if streams.dtype == torch.float64 else kernels(TRITON, streams)


def mix_and_write(
    h_res: torch.Tensor | None,
    streams: torch.Tensor,
    amplitudes: torch.Tensor,
    direction: torch.Tensor,
    implementation: str,
) -> torch.Tensor:
    """X' = H_res X + s u^T: H_res (..., n, n) per token, (n, n) static or None (identity), streams X
    (..., n, d), amplitudes s (..., n) or (n,), direction u (..., d); in the streams' dtype."""
    check_implementation(implementation)
    if implementation == "reference":
        return naive_mix_and_write(h_res, streams, amplitudes, direction)
    *batch, n, _ = streams.shape
    if h_res is None:
        h_res = torch.eye(n, dtype=streams.dtype, device=streams.device)
    h_res = h_res.expand(*batch, -1, -1)  # a static H_res enters the fused paths expanded per token
    triton = _kernels(streams)
    if triton is not None:
        return triton.triton_mix_and_write(h_res, streams, amplitudes, direction)
    return run_node(AddMixWrite, h_res, streams, amplitudes.expand(*batch, -1), direction)


def delta_write(
    h_res: torch.Tensor | None,
    streams: torch.Tensor,
    direction: torch.Tensor,
    beta: torch.Tensor,
    value: torch.Tensor,
    implementation: str,
) -> torch.Tensor:
    """X' = H_res X + s k^T, s = beta (v - H_res X k) (DDL eq. 2.5): H_res (..., n, n), (n, n) or None
    (identity), streams X (..., n, d), unit direction k (..., d), gate beta (..., 1) or (1,), value
    v (..., n); in the streams' dtype."""
    check_implementation(implementation)
    if implementation == "reference":
        return naive_delta_write(h_res, streams, direction, beta, value)
    if h_res is not None:
        h_res = h_res.expand(*streams.shape[:-2], -1, -1)
    triton = _kernels(streams)
    if triton is not None:
        return triton.triton_delta_write(h_res, streams, direction, beta, value)
    updated, _ = run_node(DeltaMixWrite, h_res, streams, direction, beta, value)
    return updated

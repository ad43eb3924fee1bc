"""The stream write (docs/ddl_mhc.md, 'Hyper-connections', 'The Deep Delta rule' and 'Fused sublayer'):
X' = H_res X + s u^T, with the amplitudes s given (mHC add) or s = beta (v - H_res X k) (the delta write, DDL
eq. 2.5). `naive.py` is the plain PyTorch reference, `node.py` the autograd nodes with hand-written backward
passes, `triton.py` the kernels. The model calls `write_streams`, whose path (kernel, node or reference) is
chosen by the one rule of `geoformers.models.ddl_mhc.ops.dispatch`.
"""

import torch

from geoformers.models.ddl_mhc.ops.dispatch import STREAM_DTYPES, choose_path, kernel, run_node
from geoformers.models.ddl_mhc.ops.stream_write.naive import naive_delta_write, naive_mix_and_write
from geoformers.models.ddl_mhc.ops.stream_write.node import AddMixWrite, DeltaMixWrite

__all__ = ["write_streams"]

TRITON = "geoformers.models.ddl_mhc.ops.stream_write.triton"


def write_streams(
    h_res: torch.Tensor | None,
    streams: torch.Tensor,
    direction: torch.Tensor,
    amplitudes: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    value: torch.Tensor | None = None,
) -> torch.Tensor:
    """X' = H_res X + s u^T in the streams' dtype: H_res (..., n, n) per token, (n, n) static or None
    (identity), streams X (..., n, d), direction u (..., d), and either the amplitudes s (..., n) or (n,)
    (mHC add, u = h) or the delta write's gate beta (..., 1) or (1,) and value v (..., n), which give
    s = beta (v - H_res X k) with u = k a unit direction (DDL eq. 2.5)."""
    delta = beta is not None or value is not None
    if delta == (amplitudes is not None) or (delta and (beta is None or value is None)):
        raise TypeError("write_streams takes either `amplitudes` (add) or both `beta` and `value` (delta)")
    path = choose_path(streams, h_res, direction, kernel_dtypes=STREAM_DTYPES)
    if path == "naive":
        if delta:
            return naive_delta_write(h_res, streams, direction, beta, value)
        return naive_mix_and_write(h_res, streams, amplitudes, direction)
    *batch, n, _ = streams.shape
    if h_res is None and not delta:  # the add write's node takes one matrix per token
        h_res = torch.eye(n, dtype=streams.dtype, device=streams.device)
    if h_res is not None:
        h_res = h_res.expand(*batch, -1, -1)  # a static H_res enters expanded per token
    name = "triton_delta_write" if delta else "triton_mix_and_write"
    write_kernel = kernel(TRITON, name) if path == "triton" else None
    if delta:
        if write_kernel is not None:
            return write_kernel(h_res, streams, direction, beta, value)
        updated, _ = run_node(DeltaMixWrite, h_res, streams, direction, beta, value)
        return updated
    if write_kernel is not None:
        return write_kernel(h_res, streams, amplitudes, direction)
    return run_node(AddMixWrite, h_res, streams, amplitudes.expand(*batch, -1), direction)

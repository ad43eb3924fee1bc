"""Plain PyTorch references of the stream writes (docs/ddl_mhc.md, 'Hyper-connections' and 'The Deep Delta
rule'), per token with streams X in R^{n x d} and the doubly-stochastic mixing H_res:

    mix-and-write   X' = H_res X + s u^T                     (mHC add: s = H_post, u = h)
    delta write     X' = H_res X (I - beta k k^T) + beta v k^T = H_res X + s k^T,
                    s = beta (v - H_res X k)                  (DDL eq. 2.5 over mixed streams)

With n = 1 (H_res = 1) the delta write is DDL with d_v = 1: x' = x + beta (v - k . x) k (DDL eq. 3.7).
"""

import torch

from geoformers.models.ddl_mhc.ops.stream_read.naive import upcast


def naive_mix_and_write(
    h_res: torch.Tensor | None, streams: torch.Tensor, amplitudes: torch.Tensor, direction: torch.Tensor
) -> torch.Tensor:
    """X' = H_res X + s u^T in the streams' dtype. H_res: (..., n, n) per token, (n, n) static or None
    (identity); X (..., n, d); amplitudes s (..., n); direction u (..., d)."""
    dtype = streams.dtype
    mixed = streams if h_res is None else torch.matmul(h_res.to(dtype), streams)
    return mixed + amplitudes.to(dtype).unsqueeze(-1) * direction.to(dtype).unsqueeze(-2)


def naive_delta_amplitudes(
    h_res: torch.Tensor | None,
    streams: torch.Tensor,
    direction: torch.Tensor,
    beta: torch.Tensor,
    value: torch.Tensor,
) -> torch.Tensor:
    """s = beta (v - H_res X k) (DDL eq. 2.5), at least float32: H_res X (I - beta k k^T) + beta v k^T =
    H_res X + s k^T. Shapes: h_res (..., n, n), (n, n) or None (identity); streams X (..., n, d);
    direction k (..., d); beta (..., 1) or (1,); value v (..., n). H_res (X k) costs one pass over X
    instead of two."""
    erased = (upcast(streams) * direction.unsqueeze(-2)).sum(-1)
    if h_res is not None:
        erased = (h_res * erased.unsqueeze(-2)).sum(-1)
    return beta * (upcast(value) - erased)


def naive_delta_write(
    h_res: torch.Tensor | None,
    streams: torch.Tensor,
    direction: torch.Tensor,
    beta: torch.Tensor,
    value: torch.Tensor,
) -> torch.Tensor:
    """X' = H_res X + s k^T with s = `naive_delta_amplitudes` (DDL eq. 2.5), in the streams' dtype."""
    amplitudes = naive_delta_amplitudes(h_res, streams, direction, beta, value)
    return naive_mix_and_write(h_res, streams, amplitudes, direction)

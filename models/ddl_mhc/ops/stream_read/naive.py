"""Plain PyTorch references of the stream read (docs/ddl_mhc.md, 'Hyper-connections'), per token with
streams X in R^{n x d}:

    z     = vec(X) W^T / rms(vec X)         the dynamic map terms (mHC's fused maps projection)
    w     = softmax(b_pre + g_pre z_pre)     the read weights H_pre
    x_in  = H_pre X = sum_j w_j X_j          the n -> 1 read
"""

import torch

FULL_PRECISION = (torch.float32, torch.float64)


def upcast(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in float32, or float64 if it already is (maps, gates and directions never run in half
    precision). A tensor already in full precision is returned as it is, without a dispatcher call (a
    decoding step makes hundreds of these calls)."""
    if tensor.dtype in FULL_PRECISION:
        return tensor
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def naive_read_streams(weights: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    """x_in = H_pre X: weights (n,) static or (..., n) per token, X (..., n, d) -> (..., d), in X's dtype."""
    weights = weights.to(streams.dtype)
    if weights.ndim == 1:
        return torch.einsum("n,...nd->...d", weights, streams)
    return (weights.unsqueeze(-1) * streams).sum(-2)


def map_terms(streams: torch.Tensor, projected: torch.Tensor, eps: float) -> torch.Tensor:
    """z = (vec(X) W^T) / sqrt(mean(vec(X)^2) + eps), at least float32: X (..., n, d) and `projected` =
    vec(X) W^T (..., m), the maps projection's output (an `nn.Linear`, or a PEFT wrapper of one) -> (..., m).
    The RMSNorm gain of mHC's normed state is folded into W, so the normed state is never formed."""
    flat = upcast(streams.flatten(-2))
    mean_square = (flat * flat).mean(-1, keepdim=True)  # not vecdot: autocast would run it in half precision
    inverse_rms = torch.rsqrt(mean_square + eps)
    return upcast(projected) * inverse_rms


def naive_stream_maps(
    streams: torch.Tensor,
    projected: torch.Tensor,
    pre_bias: torch.Tensor,
    pre_gate: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(z, w): the map terms of `map_terms` and the read weights w = softmax(b_pre + g_pre z[..., :n]);
    `naive_read_streams(w, X)` completes the reference of `node.StreamMapsRead`."""
    terms = map_terms(streams, projected, eps)
    pre_logit = upcast(pre_bias) + upcast(pre_gate) * terms[..., : streams.shape[-2]]
    return terms, torch.softmax(pre_logit, -1)

"""Deep Delta residual update (DDL, arXiv 2601.00417) over n hyper-connection streams (docs/ddl_mhc.md, 'The
Deep Delta rule').

Per token, with streams X in R^{n x d} and the doubly-stochastic mixing H_res of `hyper_connections.py`:

    k     = h / sqrt(||h||^2 + eps^2)        unit direction from the sublayer output h
    beta  = 2 sigmoid(t_beta)                gate in (0, 2), float32 (DDL eq. 2.6; t_beta: stream maps)
    v     = W_v h + b_v                      per-stream write amplitudes in R^n (DDL value)
    X'    = H_res X (I - beta k k^T) + beta v k^T = H_res X + s k^T,  s = beta (v - H_res X k)  (DDL eq. 2.5)

This file computes k, beta, v and the reference amplitudes s; the hyper-connection applies
X' = H_res X + s k^T (per-token maps: `fused_streams.DeltaMixWrite` does both in one autograd node).
With n = 1 (H_res = 1) it is DDL with d_v = 1: x' = x + beta (v - k . x) k (DDL eq. 3.7).
"""

import math

import torch
from torch import nn


def upcast(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in float32, or float64 if it already is (gates and directions never run in half precision)."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def unit_direction(output: torch.Tensor, eps: float) -> torch.Tensor:
    """k = h / sqrt(||h||^2 + eps^2) (docs/ddl_mhc.md, 'The Deep Delta rule'), at least float32: unit norm up
    to eps, finite at h = 0."""
    output = upcast(output)
    return output * torch.rsqrt(output.square().sum(-1, keepdim=True) + eps * eps)


def beta_bias_for(beta: float) -> float:
    """t with 2 sigmoid(t) = beta: the logit that starts the gate at `delta_beta_init`."""
    return math.log(beta / (2.0 - beta))


def delta_amplitudes(
    h_res: torch.Tensor | None,
    streams: torch.Tensor,
    direction: torch.Tensor,
    beta: torch.Tensor,
    value: torch.Tensor,
) -> torch.Tensor:
    """s = beta (v - H_res X k) (DDL eq. 2.5): H_res X (I - beta k k^T) + beta v k^T = H_res X + s k^T.

    Shapes: h_res (..., n, n), (n, n) or None (identity); streams X (..., n, d); direction k (..., d);
    beta (..., 1) or (1,); value v (..., n). H_res (X k) costs one pass over X instead of two."""
    erased = (upcast(streams) * direction.unsqueeze(-2)).sum(-1)
    if h_res is not None:
        erased = (h_res * erased.unsqueeze(-2)).sum(-1)
    return beta * (upcast(value) - erased)


class DeltaWrite(nn.Module):
    """The delta write's per-token quantities of one sublayer: direction k(h), gate beta(t_beta) and value
    `value_proj`(h) (a PEFT-targetable `nn.Linear`); the hyper-connection applies X' = H_res X + s k^T."""

    def __init__(self, hidden_size: int, num_streams: int, eps: float):
        super().__init__()
        self.eps = eps
        self.value_proj = nn.Linear(hidden_size, num_streams, bias=True)

    def forward(
        self, sublayer_output: torch.Tensor, beta_logit: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(k, beta, v) from h (..., d) and the gate logit t_beta ((..., 1) or (1,))."""
        direction = unit_direction(sublayer_output, self.eps)
        beta = 2.0 * torch.sigmoid(upcast(beta_logit))
        return direction, beta, self.value_proj(sublayer_output)

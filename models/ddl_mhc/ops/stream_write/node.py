"""Autograd nodes of the stream writes with hand-written backward passes (docs/ddl_mhc.md, 'Fused
sublayer'):

- `AddMixWrite`:    X' = H_res X + s u^T                       (mHC add: s = H_post, u = h)
- `DeltaMixWrite`:  X' = Y + beta (v - Y k) k^T,  Y = H_res X   (DDL eq. 2.5 with mixing)

Their references are `naive.naive_mix_and_write` and `naive.naive_delta_write`. On CPU the per-token
(n, n) x (n, d) products are batched GEMMs with contiguous operands (`bmm` on a transposed (n, n) view
falls back to one tiny product per token). Per-token maps (H_res, s, k, beta, v) enter in float32; the big
tensors stay in the streams' dtype.
"""

import torch

from geoformers.models.ddl_mhc.ops.precision import autocast_off, cast
from geoformers.models.ddl_mhc.ops.stream_read.naive import upcast
from geoformers.models.ddl_mhc.ops.stream_read.node import stream_dot, weighted_stream_sum


def _contiguous_transpose(matrices: torch.Tensor) -> torch.Tensor:
    return matrices.transpose(-1, -2).contiguous()


class AddMixWrite(torch.autograd.Function):
    """X' = H X + s u^T with one (n, n) matrix H per token (a static H enters expanded):
    dH = G X^T, dX = H^T G, ds = G u, du = G^T s."""

    @staticmethod
    def forward(ctx, h_res, streams, amplitudes, direction):
        dtype = streams.dtype
        h_res, streams = cast(h_res, dtype).contiguous(), streams.contiguous()
        amplitudes, direction = cast(amplitudes, dtype), cast(direction, dtype)
        ctx.save_for_backward(h_res, streams, amplitudes, direction)
        with autocast_off(streams.device.type):
            mixed = torch.matmul(h_res, streams)
            return mixed.addcmul_(amplitudes.unsqueeze(-1), direction.unsqueeze(-2))

    @staticmethod
    def backward(ctx, grad):
        h_res, streams, amplitudes, direction = ctx.saved_tensors
        grad = grad.to(streams.dtype).contiguous()
        grad_h_res = grad_streams = grad_amplitudes = grad_direction = None
        if ctx.needs_input_grad[0]:
            grad_h_res = torch.matmul(grad, streams.transpose(-1, -2))
        if ctx.needs_input_grad[1]:
            grad_streams = torch.matmul(_contiguous_transpose(h_res), grad)
        if ctx.needs_input_grad[2]:
            grad_amplitudes = torch.linalg.vecdot(grad, direction.unsqueeze(-2))
        if ctx.needs_input_grad[3]:
            grad_direction = weighted_stream_sum(amplitudes, grad)
        return grad_h_res, grad_streams, grad_amplitudes, grad_direction


class DeltaMixWrite(torch.autograd.Function):
    """X' = Y + s k^T, s = beta (v - Y k), Y = H X (DDL eq. 2.5 over mixed streams), with the backward

        g_k = G k,  dv = beta g_k,  dbeta = g_k . (v - Y k),  dY = G - (beta g_k) k^T,
        dH = dY X^T,  dX = H^T dY,  dk = G^T s - X^T (H^T beta g_k).

    Shapes: H (..., n, n) or None (identity: DDL with n streams and no mixing, e.g. n = 1), X (..., n, d),
    k (..., d), beta (..., 1) or (1,), v (..., n); returns (X', s)."""

    @staticmethod
    def forward(ctx, h_res, streams, direction, beta, value):
        dtype = streams.dtype
        streams = streams.contiguous()
        if h_res is not None:
            h_res = cast(h_res, dtype).contiguous()
        direction = cast(direction, dtype)
        with autocast_off(streams.device.type):
            mixed = streams.clone() if h_res is None else torch.matmul(h_res, streams)
            residual = upcast(value) - stream_dot(mixed, direction)
            amplitudes = upcast(beta) * residual
            mixed.addcmul_(cast(amplitudes, dtype).unsqueeze(-1), direction.unsqueeze(-2))
        ctx.save_for_backward(h_res, streams, direction, beta, residual, amplitudes)
        ctx.value_dtype = value.dtype
        ctx.mark_non_differentiable(amplitudes)
        return mixed, amplitudes

    @staticmethod
    def backward(ctx, grad, _grad_amplitudes):
        h_res, streams, direction, beta, residual, amplitudes = ctx.saved_tensors
        dtype = streams.dtype
        grad = grad.to(dtype).contiguous()
        grad_k = stream_dot(grad, direction)
        beta_grad_k = upcast(beta) * grad_k
        grad_value = beta_grad_k.to(ctx.value_dtype)
        grad_beta = (grad_k * residual).sum(-1, keepdim=True).sum_to_size(beta.shape).to(beta.dtype)
        erase = beta_grad_k.to(dtype).unsqueeze(-1)
        grad_mixed = torch.addcmul(grad, erase, direction.unsqueeze(-2), value=-1)
        if h_res is None:
            grad_h_res, grad_streams, back_weights = None, grad_mixed, beta_grad_k
        else:
            grad_h_res = torch.matmul(grad_mixed, streams.transpose(-1, -2))
            grad_streams = torch.matmul(_contiguous_transpose(h_res), grad_mixed)
            back_weights = (upcast(h_res) * beta_grad_k.unsqueeze(-1)).sum(-2)  # H^T (beta g_k)
        grad_direction = weighted_stream_sum(amplitudes, grad) - weighted_stream_sum(back_weights, streams)
        return grad_h_res, grad_streams, grad_direction, grad_beta, grad_value

"""Autograd nodes of the stream read with hand-written backward passes (docs/ddl_mhc.md, 'Fused sublayer'):

- `StreamMapsRead`:  z = (vec(X) W^T) / rms(X), x_in = softmax(b_pre + g_pre z_pre) X  (dynamic maps + read)
- `StreamRead`:      x_in = H_pre X                                                 (the read, given H_pre)

Their references are `naive.map_terms` / `naive.naive_stream_maps` and `naive.naive_read_streams`. On CPU
the weighted sums over streams are n multiply-adds into one (..., d) buffer, and autograd keeps one node
instead of a dozen temporaries of size (..., n, d). Per-token maps enter in float32; the big tensors stay
in the streams' dtype. The stream sums serve the write nodes too.
"""

import torch

from geoformers.models.ddl_mhc.ops.precision import autocast_off, cast
from geoformers.models.ddl_mhc.ops.stream_read.naive import upcast

# At most this many tokens, the weighted sum is one batched (1 x n) @ (n x d) product (a decoding step: one
# op instead of 5n); beyond, n multiply-adds into one buffer, faster than many tiny products on a CPU.
SMALL_BATCH_TOKENS = 64


def weighted_stream_sum(weights: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    """sum_j w_j X_j: weights (..., n), streams (..., n, d) -> (..., d), in the streams' dtype."""
    weights = cast(weights, streams.dtype)
    if streams.numel() <= SMALL_BATCH_TOKENS * streams.shape[-2] * streams.shape[-1]:
        return torch.matmul(weights.unsqueeze(-2), streams).squeeze(-2)
    total = streams[..., 0, :] * weights[..., 0, None]
    for j in range(1, streams.shape[-2]):
        total.addcmul_(streams[..., j, :], weights[..., j, None])
    return total


def stream_dot(streams: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    """X_j . u for every stream: streams (..., n, d), vector (..., d) -> (..., n), at least float32."""
    return upcast(torch.linalg.vecdot(streams, cast(vector, streams.dtype).unsqueeze(-2)))


class StreamRead(torch.autograd.Function):
    """x_in = H_pre X with per-token read weights (..., n): dX = w g^T, dw = X g."""

    @staticmethod
    def forward(ctx, weights: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weights, streams)
        with autocast_off(streams.device.type):
            return weighted_stream_sum(weights, streams)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        weights, streams = ctx.saved_tensors
        grad = grad.to(streams.dtype)
        grad_weights = grad_streams = None
        if ctx.needs_input_grad[0]:
            grad_weights = stream_dot(streams, grad).to(weights.dtype)
        if ctx.needs_input_grad[1]:
            grad_streams = weights.to(streams.dtype).unsqueeze(-1) * grad.unsqueeze(-2)
        return grad_weights, grad_streams


class StreamMapsRead(torch.autograd.Function):
    """The dynamic map terms and the read of one sublayer in one node (mHC's fused maps, then x_in = H_pre X),
    after the maps projection P = vec(X) W^T (..., m), which its caller computed (plain or LoRA-wrapped):

        r = 1 / sqrt(mean(vec(X)^2) + eps),  z = r P,  w = softmax(b_pre + g_pre z_pre),  x_in = w X

    returns (z (..., m) at least float32, x_in (..., d)); z_pre = z[..., :n]. Backward: the softmax and gate
    of the read go back into dz, then dP = r dz and d vec(X) = -(r^3 (dz . z / r) / N) vec(X) + w (x) dx_in
    (one pass over X); the projection's own backward adds P's path to vec(X) and W."""

    @staticmethod
    def forward(ctx, streams, projected, pre_bias, pre_gate, eps):
        *batch, n, d = streams.shape
        flat = streams.reshape(-1, n * d)
        with autocast_off(streams.device.type):
            full = upcast(flat)
            inverse_rms = torch.rsqrt(torch.linalg.vecdot(full, full) / (n * d) + eps).unsqueeze(-1)
            terms = upcast(projected.reshape(flat.shape[0], projected.shape[-1])) * inverse_rms
            weights = torch.softmax(upcast(pre_bias) + upcast(pre_gate) * terms[:, :n], -1)
            hidden = weighted_stream_sum(weights, flat.view(-1, n, d))
        ctx.save_for_backward(flat, pre_gate, inverse_rms, terms, weights)
        ctx.shape, ctx.projected = streams.shape, (projected.shape, projected.dtype)
        return terms.view(*batch, terms.shape[-1]), hidden.view(*batch, d)

    @staticmethod
    def backward(ctx, grad_terms, grad_hidden):
        flat, pre_gate, inverse_rms, terms, weights = ctx.saved_tensors
        *_, n, d = ctx.shape
        dtype = flat.dtype
        grad_terms = upcast(grad_terms.reshape(terms.shape)).clone()
        grad_hidden = grad_hidden.reshape(-1, d).to(dtype)
        grad_weights = stream_dot(flat.view(-1, n, d), grad_hidden)
        grad_pre = weights * (grad_weights - (weights * grad_weights).sum(-1, keepdim=True))  # softmax
        grad_pre_bias = grad_pre.sum(0)
        grad_pre_gate = (grad_pre * terms[:, :n]).sum().to(pre_gate.dtype).reshape(pre_gate.shape)
        grad_terms[:, :n].add_(grad_pre * upcast(pre_gate))
        projected_shape, projected_dtype = ctx.projected
        grad_projected = (grad_terms * inverse_rms).to(projected_dtype).view(projected_shape)
        grad_rms = (grad_terms * terms).sum(-1, keepdim=True) / inverse_rms  # dL/dr
        coefficient = -(inverse_rms**3) * grad_rms / (n * d)
        grad_streams = (flat * coefficient.to(dtype)).view(-1, n, d)
        grad_streams.addcmul_(weights.to(dtype).unsqueeze(-1), grad_hidden.unsqueeze(-2))
        return grad_streams.view(ctx.shape), grad_projected, grad_pre_bias, grad_pre_gate, None

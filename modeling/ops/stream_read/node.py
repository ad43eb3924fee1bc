"""Autograd nodes of the stream read with hand-written backward passes (docs/ddl_mhc.md, 'Fused sublayer'):

- `StreamMapsRead`:  z = vec(X) W^T / rms(X), x_in = softmax(b_pre + g_pre z_pre) X  (dynamic maps + read)
- `StreamRead`:      x_in = H_pre X                                                 (the read, given H_pre)

Their references are `naive.map_terms` / `naive.naive_stream_maps` and `naive.naive_read_streams`. On CPU
the weighted sums over streams are n multiply-adds into one (..., d) buffer, and autograd keeps one node
instead of a dozen temporaries of size (..., n, d). Per-token maps enter in float32; the big tensors stay
in the streams' dtype. `run_node` and the stream sums serve the write nodes too.
"""

import torch

from geoformers.modeling.ops.precision import autocast_off, cast
from geoformers.modeling.ops.stream_read.naive import upcast

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


class _NoTape:
    """Stands in for the autograd context when a node's forward runs alone: nothing is saved."""

    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        pass

    def mark_non_differentiable(self, *tensors: torch.Tensor) -> None:
        pass


def run_node(node: type[torch.autograd.Function], *args):
    """`node.apply(*args)`, or its forward alone when no input needs a gradient (decoding, evaluation): the
    same outputs without building an autograd node (about 20 us per call on a CPU)."""
    if torch.is_grad_enabled() and any(isinstance(arg, torch.Tensor) and arg.requires_grad for arg in args):
        return node.apply(*args)
    return node.forward(_NoTape(), *args)


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
    """The dynamic map terms and the read of one sublayer in one node (mHC's fused maps, then x_in = H_pre X):

        r = 1 / sqrt(mean(vec(X)^2) + eps),  z = r vec(X) W^T,  w = softmax(b_pre + g_pre z_pre),  x_in = w X

    returns (z (..., m) at least float32, x_in (..., d)); z_pre = z[..., :n]. Backward: the softmax and gate
    of the read go back into dz, then dW = (r dz)^T vec(X) and
    d vec(X) = (r dz) W - (r^3 (dz . z / r) / N) vec(X) + w (x) dx_in: one GEMM-accumulate, one X pass."""

    @staticmethod
    def forward(ctx, streams, weight, pre_bias, pre_gate, eps):
        *batch, n, d = streams.shape
        dtype = streams.dtype
        flat = streams.reshape(-1, n * d)
        with autocast_off(streams.device.type):
            inverse_rms = torch.rsqrt(upcast(torch.linalg.vecdot(flat, flat)) / (n * d) + eps).unsqueeze(-1)
            terms = upcast(torch.matmul(flat, cast(weight, dtype).t())) * inverse_rms
            weights = torch.softmax(upcast(pre_bias) + upcast(pre_gate) * terms[:, :n], -1)
            hidden = weighted_stream_sum(weights, flat.view(-1, n, d))
        ctx.save_for_backward(flat, weight, pre_gate, inverse_rms, terms, weights)
        ctx.shape = streams.shape
        return terms.view(*batch, -1), hidden.view(*batch, d)

    @staticmethod
    def backward(ctx, grad_terms, grad_hidden):
        flat, weight, pre_gate, inverse_rms, terms, weights = ctx.saved_tensors
        *_, n, d = ctx.shape
        dtype = flat.dtype
        grad_terms = upcast(grad_terms.reshape(terms.shape)).clone()
        grad_hidden = grad_hidden.reshape(-1, d).to(dtype)
        grad_weights = stream_dot(flat.view(-1, n, d), grad_hidden)
        grad_pre = weights * (grad_weights - (weights * grad_weights).sum(-1, keepdim=True))  # softmax
        grad_pre_bias = grad_pre.sum(0)
        grad_pre_gate = (grad_pre * terms[:, :n]).sum().to(pre_gate.dtype).reshape(pre_gate.shape)
        grad_terms[:, :n].add_(grad_pre * upcast(pre_gate))
        grad_raw = grad_terms * inverse_rms
        grad_weight = torch.matmul(grad_raw.t().to(dtype), flat).to(weight.dtype)
        grad_rms = (grad_terms * terms).sum(-1, keepdim=True) / inverse_rms  # dL/dr
        coefficient = -(inverse_rms**3) * grad_rms / (n * d)
        grad_flat = torch.addmm(flat * coefficient.to(dtype), grad_raw.to(dtype), weight.to(dtype))
        grad_streams = grad_flat.view(-1, n, d)
        grad_streams.addcmul_(weights.to(dtype).unsqueeze(-1), grad_hidden.unsqueeze(-2))
        return grad_streams.view(ctx.shape), grad_weight, grad_pre_bias, grad_pre_gate, None

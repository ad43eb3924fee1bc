"""Fused hyper-connection stream operations with hand-written backward passes (docs/ddl_mhc.md,
"Fused sublayer").

Each function is one autograd node for one step of a sublayer's update over streams X (..., n, d):

- `StreamMapsRead`:  z = vec(X) W^T / rms(X), x_in = softmax(t_pre) X  (dynamic maps and the read)
- `StreamRead`:      x_in = H_pre X                                  (the n -> 1 read, given H_pre)
- `AddMixWrite`:     X' = H_res X + s u^T                            (mHC add: s = H_post, u = h)
- `DeltaMixWrite`:   X' = Y + beta (v - Y k) k^T,  Y = H_res X        (DDL eq. 2.5 with mixing)

The plain PyTorch references are `read_streams` / `mix_and_write` in `hyper_connections.py` and
`delta_amplitudes` in `delta.py`; the tests compare outputs and gradients of both. On CPU the per-token
(n, n) x (n, d) products are batched GEMMs with contiguous operands (`bmm` on a transposed (n, n) view
falls back to one tiny product per token), the weighted sums over streams are n multiply-adds into one
(..., d) buffer, and autograd keeps one node instead of a dozen temporaries of size (..., n, d).
Per-token maps (H_res, s, k, beta, v) enter in float32; the big tensors stay in the streams' dtype.
"""

import torch

from geoformers.modeling.delta import upcast


def weighted_stream_sum(weights: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    """sum_j w_j X_j: weights (..., n), streams (..., n, d) -> (..., d), in the streams' dtype."""
    weights = weights.to(streams.dtype)
    total = streams[..., 0, :] * weights[..., 0, None]
    for j in range(1, streams.shape[-2]):
        total.addcmul_(streams[..., j, :], weights[..., j, None])
    return total


def _stream_dot(streams: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    """X_j . u for every stream: streams (..., n, d), vector (..., d) -> (..., n), at least float32."""
    return upcast(torch.linalg.vecdot(streams, vector.to(streams.dtype).unsqueeze(-2)))


def _contiguous_transpose(matrices: torch.Tensor) -> torch.Tensor:
    return matrices.transpose(-1, -2).contiguous()


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
        with torch.autocast(device_type=streams.device.type, enabled=False):
            return weighted_stream_sum(weights, streams)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        weights, streams = ctx.saved_tensors
        grad = grad.to(streams.dtype)
        grad_weights = grad_streams = None
        if ctx.needs_input_grad[0]:
            grad_weights = _stream_dot(streams, grad).to(weights.dtype)
        if ctx.needs_input_grad[1]:
            grad_streams = weights.to(streams.dtype).unsqueeze(-1) * grad.unsqueeze(-2)
        return grad_weights, grad_streams


class AddMixWrite(torch.autograd.Function):
    """X' = H X + s u^T with one (n, n) matrix H per token (a static H enters expanded):
    dH = G X^T, dX = H^T G, ds = G u, du = G^T s."""

    @staticmethod
    def forward(ctx, h_res, streams, amplitudes, direction):
        dtype = streams.dtype
        h_res, streams = h_res.to(dtype).contiguous(), streams.contiguous()
        amplitudes, direction = amplitudes.to(dtype), direction.to(dtype)
        ctx.save_for_backward(h_res, streams, amplitudes, direction)
        with torch.autocast(device_type=streams.device.type, enabled=False):
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
            h_res = h_res.to(dtype).contiguous()
        direction = direction.to(dtype)
        with torch.autocast(device_type=streams.device.type, enabled=False):
            mixed = streams.clone() if h_res is None else torch.matmul(h_res, streams)
            residual = upcast(value) - _stream_dot(mixed, direction)
            amplitudes = upcast(beta) * residual
            mixed.addcmul_(amplitudes.to(dtype).unsqueeze(-1), direction.unsqueeze(-2))
        ctx.save_for_backward(h_res, streams, direction, beta, residual, amplitudes)
        ctx.value_dtype = value.dtype
        ctx.mark_non_differentiable(amplitudes)
        return mixed, amplitudes

    @staticmethod
    def backward(ctx, grad, _grad_amplitudes):
        h_res, streams, direction, beta, residual, amplitudes = ctx.saved_tensors
        dtype = streams.dtype
        grad = grad.to(dtype).contiguous()
        grad_k = _stream_dot(grad, direction)
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
        with torch.autocast(device_type=streams.device.type, enabled=False):
            inverse_rms = torch.rsqrt(upcast(torch.linalg.vecdot(flat, flat)) / (n * d) + eps).unsqueeze(-1)
            terms = upcast(torch.matmul(flat, weight.to(dtype).t())) * inverse_rms
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
        grad_weights = _stream_dot(flat.view(-1, n, d), grad_hidden)
        grad_pre = weights * (grad_weights - (weights * grad_weights).sum(-1, keepdim=True))  # softmax
        grad_pre_bias = grad_pre.sum(0)
        grad_pre_gate = (grad_pre * terms[:, :n]).sum().to(pre_gate.dtype)
        grad_terms[:, :n].add_(grad_pre * upcast(pre_gate))
        grad_raw = grad_terms * inverse_rms
        grad_weight = torch.matmul(grad_raw.t().to(dtype), flat).to(weight.dtype)
        grad_rms = (grad_terms * terms).sum(-1, keepdim=True) / inverse_rms  # dL/dr
        coefficient = -(inverse_rms**3) * grad_rms / (n * d)
        grad_flat = torch.addmm(flat * coefficient.to(dtype), grad_raw.to(dtype), weight.to(dtype))
        grad_streams = grad_flat.view(-1, n, d)
        grad_streams.addcmul_(weights.to(dtype).unsqueeze(-1), grad_hidden.unsqueeze(-2))
        return grad_streams.view(ctx.shape), grad_weight, grad_pre_bias, grad_pre_gate, None

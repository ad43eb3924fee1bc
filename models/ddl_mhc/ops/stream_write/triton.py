"""Triton kernels of the stream writes (references `naive.naive_mix_and_write`, `naive.naive_delta_write`),
per token with streams X in R^{n x d}:

    add write     X'   = H X + s u^T                                     (mHC)
    delta write   X'   = Y + beta (v - Y k) k^T,  Y = H X                 (DDL eq. 2.5 over n streams)

One program per token walks the hidden dimension in blocks of `block_d`; the delta write needs X k before
it can write, so it reads X once when the whole row fits in one block and twice otherwise. Forward and
backward are hand-written (one autograd.Function each). Streams and outputs keep the input dtype
(float32 or bfloat16); the small operands (H, s, u, k, beta, v) and all accumulation are float32, and
each gradient is returned in its input's dtype. Per-token operands may be broadcast (stride 0 over tokens,
e.g. a static H or beta); their gradients are then summed by autograd's expand.
"""

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from geoformers.models.ddl_mhc.ops.stream_read.triton import (
    check_streams,
    launch_options,
    load_tile,
    load_vector,
    per_token,
    store_tile,
    store_vector,
)


@triton.jit
def _matrix(ptr, stride, token, N: tl.constexpr, NP: tl.constexpr):
    """The (NP, NP) float32 matrix of `token` (rows of N contiguous entries), zero-padded."""
    rows, cols = tl.arange(0, NP), tl.arange(0, NP)
    mask = (rows[:, None] < N) & (cols[None, :] < N)
    offsets = token * stride + rows[:, None] * N + cols[None, :]
    return tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _store_matrix(ptr, value, token, N: tl.constexpr, NP: tl.constexpr):
    rows, cols = tl.arange(0, NP), tl.arange(0, NP)
    mask = (rows[:, None] < N) & (cols[None, :] < N)
    offsets = token * N * N + rows[:, None] * N + cols[None, :]
    tl.store(ptr + offsets, value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _mix(h, x):
    """H X for H (NP, NP) and a tile X (NP, BD)."""
    return tl.sum(h[:, :, None] * x[None, :, :], axis=1)


@triton.jit
def _mix_transposed(h, g):
    """H^T G for H (NP, NP) and a tile G (NP, BD)."""
    return tl.sum(h[:, :, None] * g[:, None, :], axis=0)


# ----------------------------------------------------------------------------------------------
# Add write: X' = H X + s u^T; backward dH = G X^T, dX = H^T G, ds = G u, du = G^T s


@triton.jit
def _write_forward_kernel(
    h_ptr, x_ptr, s_ptr, u_ptr, out_ptr, d, stride_h, stride_s, stride_u,
    N: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    h = _matrix(h_ptr, stride_h, token, N, NP)
    s = load_vector(s_ptr, stride_s, token, N, 0, NP)
    for off in range(0, d, BD):
        x = load_tile(x_ptr, token, d, off, N, NP, BD)
        u = load_vector(u_ptr, stride_u, token, d, off, BD)
        store_tile(out_ptr, _mix(h, x) + s[:, None] * u[None, :], token, d, off, N, NP, BD)


@triton.jit
def _write_backward_kernel(
    h_ptr, x_ptr, s_ptr, u_ptr, g_ptr, grad_h_ptr, grad_x_ptr, grad_s_ptr, grad_u_ptr,
    d, stride_h, stride_s, stride_u,
    N: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    h = _matrix(h_ptr, stride_h, token, N, NP)
    s = load_vector(s_ptr, stride_s, token, N, 0, NP)
    grad_h = tl.zeros((NP, NP), tl.float32)
    grad_s = tl.zeros((NP,), tl.float32)
    for off in range(0, d, BD):
        x = load_tile(x_ptr, token, d, off, N, NP, BD)
        g = load_tile(g_ptr, token, d, off, N, NP, BD)
        u = load_vector(u_ptr, stride_u, token, d, off, BD)
        grad_h += tl.sum(g[:, None, :] * x[None, :, :], axis=2)
        grad_s += tl.sum(g * u[None, :], axis=1)
        store_tile(grad_x_ptr, _mix_transposed(h, g), token, d, off, N, NP, BD)
        store_vector(grad_u_ptr, tl.sum(s[:, None] * g, axis=0), d, token, d, off, BD)
    _store_matrix(grad_h_ptr, grad_h, token, N, NP)
    store_vector(grad_s_ptr, grad_s, N, token, N, 0, NP)


# ----------------------------------------------------------------------------------------------
# Delta write: X' = Y + s k^T, s = beta (v - H e), e = X k, Y = H X. Backward, with gs = G k,
# ge = -beta gs, q = H^T ge: dv = beta gs, dbeta = <gs, v - H e>, dH = G X^T + ge e^T,
# dX = H^T G + q k^T, dk = G^T s + X^T q.


@triton.jit
def _delta_amplitudes(h, e, beta_ptr, v_ptr, stride_beta, stride_v, token, N: tl.constexpr, NP: tl.constexpr):
    """(s, v - H e, beta) of one token from H and e = X k."""
    beta = tl.load(beta_ptr + token * stride_beta).to(tl.float32)
    residual = load_vector(v_ptr, stride_v, token, N, 0, NP) - tl.sum(h * e[None, :], axis=1)
    return beta * residual, residual, beta


@triton.jit
def _delta_forward_kernel(
    h_ptr, x_ptr, k_ptr, beta_ptr, v_ptr, out_ptr, d, stride_h, stride_k, stride_beta, stride_v,
    N: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr, ONE_BLOCK: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    h = _matrix(h_ptr, stride_h, token, N, NP)
    if ONE_BLOCK:  # the row fits: read X once
        x = load_tile(x_ptr, token, d, 0, N, NP, BD)
        k = load_vector(k_ptr, stride_k, token, d, 0, BD)
        s, _, _ = _delta_amplitudes(
            h, tl.sum(x * k[None, :], axis=1), beta_ptr, v_ptr, stride_beta, stride_v, token, N, NP
        )
        store_tile(out_ptr, _mix(h, x) + s[:, None] * k[None, :], token, d, 0, N, NP, BD)
    else:
        e = tl.zeros((NP,), tl.float32)
        for off in range(0, d, BD):
            k = load_vector(k_ptr, stride_k, token, d, off, BD)
            e += tl.sum(load_tile(x_ptr, token, d, off, N, NP, BD) * k[None, :], axis=1)
        s, _, _ = _delta_amplitudes(h, e, beta_ptr, v_ptr, stride_beta, stride_v, token, N, NP)
        for off in range(0, d, BD):
            x = load_tile(x_ptr, token, d, off, N, NP, BD)
            k = load_vector(k_ptr, stride_k, token, d, off, BD)
            store_tile(out_ptr, _mix(h, x) + s[:, None] * k[None, :], token, d, off, N, NP, BD)


@triton.jit
def _delta_backward_kernel(
    h_ptr, x_ptr, k_ptr, beta_ptr, v_ptr, g_ptr,
    grad_h_ptr, grad_x_ptr, grad_k_ptr, grad_beta_ptr, grad_v_ptr,
    d, stride_h, stride_k, stride_beta, stride_v,
    N: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    h = _matrix(h_ptr, stride_h, token, N, NP)
    e = tl.zeros((NP,), tl.float32)
    grad_s = tl.zeros((NP,), tl.float32)
    grad_h = tl.zeros((NP, NP), tl.float32)
    for off in range(0, d, BD):
        x = load_tile(x_ptr, token, d, off, N, NP, BD)
        g = load_tile(g_ptr, token, d, off, N, NP, BD)
        k = load_vector(k_ptr, stride_k, token, d, off, BD)
        e += tl.sum(x * k[None, :], axis=1)
        grad_s += tl.sum(g * k[None, :], axis=1)
        grad_h += tl.sum(g[:, None, :] * x[None, :, :], axis=2)
    s, residual, beta = _delta_amplitudes(h, e, beta_ptr, v_ptr, stride_beta, stride_v, token, N, NP)
    grad_e = -beta * grad_s
    q = tl.sum(h * grad_e[:, None], axis=0)
    _store_matrix(grad_h_ptr, grad_h + grad_e[:, None] * e[None, :], token, N, NP)
    store_vector(grad_v_ptr, beta * grad_s, N, token, N, 0, NP)
    tl.store(grad_beta_ptr + token, tl.sum(grad_s * residual, axis=0).to(grad_beta_ptr.dtype.element_ty))
    for off in range(0, d, BD):
        x = load_tile(x_ptr, token, d, off, N, NP, BD)
        g = load_tile(g_ptr, token, d, off, N, NP, BD)
        k = load_vector(k_ptr, stride_k, token, d, off, BD)
        store_tile(grad_x_ptr, _mix_transposed(h, g) + q[:, None] * k[None, :], token, d, off, N, NP, BD)
        grad_k = tl.sum(s[:, None] * g + q[:, None] * x, axis=0)
        store_vector(grad_k_ptr, grad_k, d, token, d, off, BD)


# ----------------------------------------------------------------------------------------------
# autograd.Functions (inputs flattened to tokens by the wrappers below)


class _Write(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_res, streams, amplitudes, direction, block_d):
        tokens, n, d = streams.shape
        meta = launch_options(n, d, block_d, square=True)
        strides = (h_res.stride(0), amplitudes.stride(0), direction.stride(0))
        out = torch.empty_like(streams)
        _write_forward_kernel[(tokens,)](h_res, streams, amplitudes, direction, out, d, *strides, **meta)
        ctx.save_for_backward(h_res, streams, amplitudes, direction)
        ctx.meta, ctx.strides = meta, strides
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        h_res, streams, amplitudes, direction = ctx.saved_tensors
        tokens, n, d = streams.shape
        grads = (
            h_res.new_empty(tokens, n, n),
            torch.empty_like(streams),
            amplitudes.new_empty(tokens, n),
            direction.new_empty(tokens, d),
        )
        _write_backward_kernel[(tokens,)](
            h_res, streams, amplitudes, direction, grad.contiguous(), *grads, d, *ctx.strides, **ctx.meta
        )
        return (*grads, None)


class _DeltaWrite(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_res, streams, direction, beta, value, block_d):
        tokens, n, d = streams.shape
        meta = launch_options(n, d, block_d, square=True)
        strides = (h_res.stride(0), direction.stride(0), beta.stride(0), value.stride(0))
        out = torch.empty_like(streams)
        _delta_forward_kernel[(tokens,)](
            h_res, streams, direction, beta, value, out, d, *strides, **meta, ONE_BLOCK=meta["BD"] >= d
        )
        ctx.save_for_backward(h_res, streams, direction, beta, value)
        ctx.meta, ctx.strides = meta, strides
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        h_res, streams, direction, beta, value = ctx.saved_tensors
        tokens, n, d = streams.shape
        grads = (
            h_res.new_empty(tokens, n, n),
            torch.empty_like(streams),
            direction.new_empty(tokens, d),
            beta.new_empty(tokens, 1),
            value.new_empty(tokens, n),
        )
        _delta_backward_kernel[(tokens,)](
            h_res, streams, direction, beta, value, grad.contiguous(), *grads, d, *ctx.strides, **ctx.meta
        )
        return (*grads, None)


# ----------------------------------------------------------------------------------------------
# Public wrappers (same shapes as the PyTorch references)


def triton_mix_and_write(
    h_res: torch.Tensor | None,
    streams: torch.Tensor,
    amplitudes: torch.Tensor,
    direction: torch.Tensor,
    block_d: int | None = None,
) -> torch.Tensor:
    """`naive_mix_and_write` as a kernel: X' = H_res X + s u^T (mHC); H_res (..., n, n), (n, n) or None
    (identity), X (..., n, d), s (..., n), u (..., d); the result in X's dtype."""
    n, d = check_streams(streams)
    batch = streams.shape[:-2]
    if h_res is None:
        h_res = torch.eye(n, device=streams.device)
    out = _Write.apply(
        per_token("h_res", h_res, batch, (n, n)),
        streams.reshape(batch.numel(), n, d).contiguous(),
        per_token("amplitudes", amplitudes, batch, (n,)),
        per_token("direction", direction, batch, (d,)),
        block_d,
    )
    return out.view(*batch, n, d)


def triton_delta_write(
    h_res: torch.Tensor | None,
    streams: torch.Tensor,
    direction: torch.Tensor,
    beta: torch.Tensor,
    value: torch.Tensor,
    block_d: int | None = None,
) -> torch.Tensor:
    """Fused delta write X' = Y + beta (v - Y k) k^T, Y = H_res X (DDL eq. 2.5), i.e.
    `naive_delta_write(h_res, X, k, beta, v)`. H_res (..., n, n), (n, n) or None
    (identity); X (..., n, d); k (..., d); beta (..., 1) or (1,); v (..., n); the result in X's dtype."""
    n, d = check_streams(streams)
    batch = streams.shape[:-2]
    if h_res is None:
        h_res = torch.eye(n, device=streams.device)
    out = _DeltaWrite.apply(
        per_token("h_res", h_res, batch, (n, n)),
        streams.reshape(batch.numel(), n, d).contiguous(),
        per_token("direction", direction, batch, (d,)),
        per_token("beta", beta, batch, (1,)),
        per_token("value", value, batch, (n,)),
        block_d,
    )
    return out.view(*batch, n, d)

"""Triton kernels for the hyper-connection stream read and writes of `hyper_connections.py` / `delta.py`.

Per token, with streams X in R^{n x d}:

    read          x_in = H_pre X = sum_j w_j X_j                         (mHC read; `read_streams`)
    add write     X'   = H X + s u^T                                     (mHC; `mix_and_write`)
    delta write   X'   = Y + beta (v - Y k) k^T,  Y = H X                 (DDL eq. 2.5 over n streams;
                                                        `delta_amplitudes`, then `mix_and_write`)

One program per token walks the hidden dimension in blocks of `block_d`; the delta write needs X k before
it can write, so it reads X once when the whole row fits in one block and twice otherwise. Forward and
backward are hand-written (one autograd.Function each). Streams and outputs keep the input dtype
(float32 or bfloat16); the small operands (w, H, s, u, k, beta, v) and all accumulation are float32,
and each gradient is returned in its input's dtype. Per-token operands may be broadcast (stride 0 over
tokens, e.g. a static H or beta); their gradients are then summed by autograd's expand.
"""

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

_TILE = 16384  # elements of the largest register tile a program holds (n x n x block_d for the writes)


@triton.jit
def _tile(ptr, token, d, off, N: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr):
    """(NP, BD) float32 tile of the (N, d) row of `token` at columns off..off+BD, zero outside."""
    rows, cols = tl.arange(0, NP), off + tl.arange(0, BD)
    mask = (rows[:, None] < N) & (cols[None, :] < d)
    offsets = token * N * d + rows[:, None] * d + cols[None, :]
    return tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _store_tile(ptr, value, token, d, off, N: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr):
    rows, cols = tl.arange(0, NP), off + tl.arange(0, BD)
    mask = (rows[:, None] < N) & (cols[None, :] < d)
    offsets = token * N * d + rows[:, None] * d + cols[None, :]
    tl.store(ptr + offsets, value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _vector(ptr, stride, token, size, off, BLOCK: tl.constexpr):
    """float32 entries off..off+BLOCK of the per-token vector at ptr + token * stride, zero outside."""
    index = off + tl.arange(0, BLOCK)
    return tl.load(ptr + token * stride + index, mask=index < size, other=0.0).to(tl.float32)


@triton.jit
def _store_vector(ptr, value, stride, token, size, off, BLOCK: tl.constexpr):
    index = off + tl.arange(0, BLOCK)
    tl.store(ptr + token * stride + index, value.to(ptr.dtype.element_ty), mask=index < size)


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
# Read: x_in = sum_j w_j X_j; backward dX_j = w_j g, dw_j = <g, X_j>


@triton.jit
def _read_forward_kernel(
    w_ptr, x_ptr, out_ptr, d, stride_w, N: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr
):
    token = tl.program_id(0).to(tl.int64)
    w = _vector(w_ptr, stride_w, token, N, 0, NP)
    for off in range(0, d, BD):
        x = _tile(x_ptr, token, d, off, N, NP, BD)
        _store_vector(out_ptr, tl.sum(w[:, None] * x, axis=0), d, token, d, off, BD)


@triton.jit
def _read_backward_kernel(
    w_ptr, x_ptr, g_ptr, grad_w_ptr, grad_x_ptr, d, stride_w,
    N: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    w = _vector(w_ptr, stride_w, token, N, 0, NP)
    grad_w = tl.zeros((NP,), tl.float32)
    for off in range(0, d, BD):
        x = _tile(x_ptr, token, d, off, N, NP, BD)
        g = _vector(g_ptr, d, token, d, off, BD)
        grad_w += tl.sum(x * g[None, :], axis=1)
        _store_tile(grad_x_ptr, w[:, None] * g[None, :], token, d, off, N, NP, BD)
    _store_vector(grad_w_ptr, grad_w, N, token, N, 0, NP)


# ----------------------------------------------------------------------------------------------
# Add write: X' = H X + s u^T; backward dH = G X^T, dX = H^T G, ds = G u, du = G^T s


@triton.jit
def _write_forward_kernel(
    h_ptr, x_ptr, s_ptr, u_ptr, out_ptr, d, stride_h, stride_s, stride_u,
    N: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    h = _matrix(h_ptr, stride_h, token, N, NP)
    s = _vector(s_ptr, stride_s, token, N, 0, NP)
    for off in range(0, d, BD):
        x = _tile(x_ptr, token, d, off, N, NP, BD)
        u = _vector(u_ptr, stride_u, token, d, off, BD)
        _store_tile(out_ptr, _mix(h, x) + s[:, None] * u[None, :], token, d, off, N, NP, BD)


@triton.jit
def _write_backward_kernel(
    h_ptr, x_ptr, s_ptr, u_ptr, g_ptr, grad_h_ptr, grad_x_ptr, grad_s_ptr, grad_u_ptr,
    d, stride_h, stride_s, stride_u,
    N: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    h = _matrix(h_ptr, stride_h, token, N, NP)
    s = _vector(s_ptr, stride_s, token, N, 0, NP)
    grad_h = tl.zeros((NP, NP), tl.float32)
    grad_s = tl.zeros((NP,), tl.float32)
    for off in range(0, d, BD):
        x = _tile(x_ptr, token, d, off, N, NP, BD)
        g = _tile(g_ptr, token, d, off, N, NP, BD)
        u = _vector(u_ptr, stride_u, token, d, off, BD)
        grad_h += tl.sum(g[:, None, :] * x[None, :, :], axis=2)
        grad_s += tl.sum(g * u[None, :], axis=1)
        _store_tile(grad_x_ptr, _mix_transposed(h, g), token, d, off, N, NP, BD)
        _store_vector(grad_u_ptr, tl.sum(s[:, None] * g, axis=0), d, token, d, off, BD)
    _store_matrix(grad_h_ptr, grad_h, token, N, NP)
    _store_vector(grad_s_ptr, grad_s, N, token, N, 0, NP)


# ----------------------------------------------------------------------------------------------
# Delta write: X' = Y + s k^T, s = beta (v - H e), e = X k, Y = H X. Backward, with gs = G k,
# ge = -beta gs, q = H^T ge: dv = beta gs, dbeta = <gs, v - H e>, dH = G X^T + ge e^T,
# dX = H^T G + q k^T, dk = G^T s + X^T q.


@triton.jit
def _delta_amplitudes(h, e, beta_ptr, v_ptr, stride_beta, stride_v, token, N: tl.constexpr, NP: tl.constexpr):
    """(s, v - H e, beta) of one token from H and e = X k."""
    beta = tl.load(beta_ptr + token * stride_beta).to(tl.float32)
    residual = _vector(v_ptr, stride_v, token, N, 0, NP) - tl.sum(h * e[None, :], axis=1)
    return beta * residual, residual, beta


@triton.jit
def _delta_forward_kernel(
    h_ptr, x_ptr, k_ptr, beta_ptr, v_ptr, out_ptr, d, stride_h, stride_k, stride_beta, stride_v,
    N: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr, ONE_BLOCK: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    h = _matrix(h_ptr, stride_h, token, N, NP)
    if ONE_BLOCK:  # the row fits: read X once
        x = _tile(x_ptr, token, d, 0, N, NP, BD)
        k = _vector(k_ptr, stride_k, token, d, 0, BD)
        s, _, _ = _delta_amplitudes(
            h, tl.sum(x * k[None, :], axis=1), beta_ptr, v_ptr, stride_beta, stride_v, token, N, NP
        )
        _store_tile(out_ptr, _mix(h, x) + s[:, None] * k[None, :], token, d, 0, N, NP, BD)
    else:
        e = tl.zeros((NP,), tl.float32)
        for off in range(0, d, BD):
            k = _vector(k_ptr, stride_k, token, d, off, BD)
            e += tl.sum(_tile(x_ptr, token, d, off, N, NP, BD) * k[None, :], axis=1)
        s, _, _ = _delta_amplitudes(h, e, beta_ptr, v_ptr, stride_beta, stride_v, token, N, NP)
        for off in range(0, d, BD):
            x = _tile(x_ptr, token, d, off, N, NP, BD)
            k = _vector(k_ptr, stride_k, token, d, off, BD)
            _store_tile(out_ptr, _mix(h, x) + s[:, None] * k[None, :], token, d, off, N, NP, BD)


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
        x = _tile(x_ptr, token, d, off, N, NP, BD)
        g = _tile(g_ptr, token, d, off, N, NP, BD)
        k = _vector(k_ptr, stride_k, token, d, off, BD)
        e += tl.sum(x * k[None, :], axis=1)
        grad_s += tl.sum(g * k[None, :], axis=1)
        grad_h += tl.sum(g[:, None, :] * x[None, :, :], axis=2)
    s, residual, beta = _delta_amplitudes(h, e, beta_ptr, v_ptr, stride_beta, stride_v, token, N, NP)
    grad_e = -beta * grad_s
    q = tl.sum(h * grad_e[:, None], axis=0)
    _store_matrix(grad_h_ptr, grad_h + grad_e[:, None] * e[None, :], token, N, NP)
    _store_vector(grad_v_ptr, beta * grad_s, N, token, N, 0, NP)
    tl.store(grad_beta_ptr + token, tl.sum(grad_s * residual, axis=0).to(grad_beta_ptr.dtype.element_ty))
    for off in range(0, d, BD):
        x = _tile(x_ptr, token, d, off, N, NP, BD)
        g = _tile(g_ptr, token, d, off, N, NP, BD)
        k = _vector(k_ptr, stride_k, token, d, off, BD)
        _store_tile(grad_x_ptr, _mix_transposed(h, g) + q[:, None] * k[None, :], token, d, off, N, NP, BD)
        grad_k = tl.sum(s[:, None] * g + q[:, None] * x, axis=0)
        _store_vector(grad_k_ptr, grad_k, d, token, d, off, BD)


# ----------------------------------------------------------------------------------------------
# autograd.Functions (inputs flattened to tokens by the wrappers below)


def _meta(n: int, d: int, block_d: int | None, square: bool) -> dict:
    """Launch options: N, NP (n rounded up to a power of two), BD (the hidden block) and num_warps (8 from
    n > 4, where the n x n x BD products would otherwise spill registers)."""
    padded = triton.next_power_of_2(n)
    if block_d is not None and (isinstance(block_d, bool) or not isinstance(block_d, int) or block_d < 1):
        raise ValueError(f"block_d must be a positive int or None, got {block_d!r}")
    if block_d is None:
        block_d = max(16, _TILE // (padded * padded if square else padded))
    block_d = min(triton.next_power_of_2(block_d), triton.next_power_of_2(max(d, 1)))
    return {"N": n, "NP": padded, "BD": block_d, "num_warps": 4 if padded <= 4 else 8}


class _Read(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weights, streams, block_d):
        tokens, n, d = streams.shape
        meta = _meta(n, d, block_d, square=False)
        out = streams.new_empty(tokens, d)
        _read_forward_kernel[(tokens,)](weights, streams, out, d, weights.stride(0), **meta)
        ctx.save_for_backward(weights, streams)
        ctx.meta = meta
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        weights, streams = ctx.saved_tensors
        tokens, _, d = streams.shape
        grad_w = weights.new_empty(tokens, weights.shape[1])
        grad_x = torch.empty_like(streams)
        _read_backward_kernel[(tokens,)](
            weights, streams, grad.contiguous(), grad_w, grad_x, d, weights.stride(0), **ctx.meta
        )
        return grad_w, grad_x, None


class _Write(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_res, streams, amplitudes, direction, block_d):
        tokens, n, d = streams.shape
        meta = _meta(n, d, block_d, square=True)
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
        meta = _meta(n, d, block_d, square=True)
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


def _check_streams(streams: torch.Tensor) -> tuple[int, int]:
    if not isinstance(streams, torch.Tensor) or not streams.is_floating_point() or streams.ndim < 2:
        raise TypeError("streams must be a floating torch.Tensor of shape (..., n, d)")
    if streams.dtype == torch.float64:
        raise TypeError(
            "streams are float64; the Triton kernels accumulate in float32 (use the PyTorch path)"
        )
    return streams.shape[-2], streams.shape[-1]


def _per_token(name: str, tensor: torch.Tensor, batch: torch.Size, inner: tuple[int, ...]) -> torch.Tensor:
    """`tensor` broadcast to (*batch, *inner) and flattened to (tokens, *inner), float32 unless float64, with
    contiguous inner dimensions; a broadcast token dimension stays a stride-0 view."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
        raise TypeError(f"{name} must be a floating torch.Tensor")
    if tuple(tensor.shape[-len(inner) :]) != inner:
        raise ValueError(f"{name} must end in shape {inner}, got {tuple(tensor.shape)}")
    try:
        tensor = tensor.to(torch.promote_types(tensor.dtype, torch.float32)).expand(*batch, *inner)
    except RuntimeError as error:
        raise ValueError(
            f"{name} of shape {tuple(tensor.shape)} does not broadcast to {(*batch, *inner)}"
        ) from error
    flat = tensor.reshape(batch.numel(), *inner)
    if flat.stride()[1:] != torch.empty(inner).stride():
        flat = flat.contiguous()
    return flat


def triton_read_streams(
    weights: torch.Tensor, streams: torch.Tensor, block_d: int | None = None
) -> torch.Tensor:
    """`read_streams`: x_in = H_pre X; weights (n,) static or (..., n) per token, X (..., n, d)
    -> (..., d) in X's dtype."""
    n, d = _check_streams(streams)
    batch = streams.shape[:-2]
    flat_w = _per_token("weights", weights, batch, (n,))
    out = _Read.apply(flat_w, streams.reshape(batch.numel(), n, d).contiguous(), block_d)
    return out.view(*batch, d)


def triton_mix_and_write(
    h_res: torch.Tensor | None,
    streams: torch.Tensor,
    amplitudes: torch.Tensor,
    direction: torch.Tensor,
    block_d: int | None = None,
) -> torch.Tensor:
    """`mix_and_write`: X' = H_res X + s u^T (mHC); H_res (..., n, n), (n, n) or None (identity),
    X (..., n, d), s (..., n), u (..., d); the result in X's dtype."""
    n, d = _check_streams(streams)
    batch = streams.shape[:-2]
    if h_res is None:
        h_res = torch.eye(n, device=streams.device)
    out = _Write.apply(
        _per_token("h_res", h_res, batch, (n, n)),
        streams.reshape(batch.numel(), n, d).contiguous(),
        _per_token("amplitudes", amplitudes, batch, (n,)),
        _per_token("direction", direction, batch, (d,)),
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
    `mix_and_write(h_res, X, delta_amplitudes(h_res, X, k, beta, v), k)`. H_res (..., n, n), (n, n) or None
    (identity); X (..., n, d); k (..., d); beta (..., 1) or (1,); v (..., n); the result in X's dtype."""
    n, d = _check_streams(streams)
    batch = streams.shape[:-2]
    if h_res is None:
        h_res = torch.eye(n, device=streams.device)
    out = _DeltaWrite.apply(
        _per_token("h_res", h_res, batch, (n, n)),
        streams.reshape(batch.numel(), n, d).contiguous(),
        _per_token("direction", direction, batch, (d,)),
        _per_token("beta", beta, batch, (1,)),
        _per_token("value", value, batch, (n,)),
        block_d,
    )
    return out.view(*batch, n, d)

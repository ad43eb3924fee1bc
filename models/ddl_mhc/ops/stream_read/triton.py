"""Triton kernel of the stream read x_in = H_pre X = sum_j w_j X_j (mHC read; reference
`naive.naive_read_streams`), and the tile helpers and launch options the write kernels share.

One program per token walks the hidden dimension in blocks of `block_d`. Forward and backward are
hand-written (one autograd.Function). Streams and outputs keep the input dtype (float32 or bfloat16); the
read weights and all accumulation are float32, and each gradient is returned in its input's dtype.
Per-token operands may be broadcast (stride 0 over tokens, e.g. static weights); their gradients are then
summed by autograd's expand.
"""

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

TILE = 16384  # elements of the largest register tile a program holds (n x n x block_d for the writes)


@triton.jit
def load_tile(ptr, token, d, off, N: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr):
    """(NP, BD) float32 tile of the (N, d) row of `token` at columns off..off+BD, zero outside."""
    rows, cols = tl.arange(0, NP), off + tl.arange(0, BD)
    mask = (rows[:, None] < N) & (cols[None, :] < d)
    offsets = token * N * d + rows[:, None] * d + cols[None, :]
    return tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store_tile(ptr, value, token, d, off, N: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr):
    rows, cols = tl.arange(0, NP), off + tl.arange(0, BD)
    mask = (rows[:, None] < N) & (cols[None, :] < d)
    offsets = token * N * d + rows[:, None] * d + cols[None, :]
    tl.store(ptr + offsets, value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def load_vector(ptr, stride, token, size, off, BLOCK: tl.constexpr):
    """float32 entries off..off+BLOCK of the per-token vector at ptr + token * stride, zero outside."""
    index = off + tl.arange(0, BLOCK)
    return tl.load(ptr + token * stride + index, mask=index < size, other=0.0).to(tl.float32)


@triton.jit
def store_vector(ptr, value, stride, token, size, off, BLOCK: tl.constexpr):
    index = off + tl.arange(0, BLOCK)
    tl.store(ptr + token * stride + index, value.to(ptr.dtype.element_ty), mask=index < size)


# ----------------------------------------------------------------------------------------------
# Read: x_in = sum_j w_j X_j; backward dX_j = w_j g, dw_j = <g, X_j>


@triton.jit
def _read_forward_kernel(
    w_ptr, x_ptr, out_ptr, d, stride_w, N: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr
):
    token = tl.program_id(0).to(tl.int64)
    w = load_vector(w_ptr, stride_w, token, N, 0, NP)
    for off in range(0, d, BD):
        x = load_tile(x_ptr, token, d, off, N, NP, BD)
        store_vector(out_ptr, tl.sum(w[:, None] * x, axis=0), d, token, d, off, BD)


@triton.jit
def _read_backward_kernel(
    w_ptr, x_ptr, g_ptr, grad_w_ptr, grad_x_ptr, d, stride_w,
    N: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    w = load_vector(w_ptr, stride_w, token, N, 0, NP)
    grad_w = tl.zeros((NP,), tl.float32)
    for off in range(0, d, BD):
        x = load_tile(x_ptr, token, d, off, N, NP, BD)
        g = load_vector(g_ptr, d, token, d, off, BD)
        grad_w += tl.sum(x * g[None, :], axis=1)
        store_tile(grad_x_ptr, w[:, None] * g[None, :], token, d, off, N, NP, BD)
    store_vector(grad_w_ptr, grad_w, N, token, N, 0, NP)


# ----------------------------------------------------------------------------------------------
# autograd.Functions (inputs flattened to tokens by the wrappers below)


def launch_options(n: int, d: int, block_d: int | None, square: bool) -> dict:
    """Launch options: N, NP (n rounded up to a power of two), BD (the hidden block) and num_warps (8 from
    n > 4, where the n x n x BD products would otherwise spill registers)."""
    padded = triton.next_power_of_2(n)
    if block_d is not None and (isinstance(block_d, bool) or not isinstance(block_d, int) or block_d < 1):
        raise ValueError(f"block_d must be a positive int or None, got {block_d!r}")
    if block_d is None:
        block_d = max(16, TILE // (padded * padded if square else padded))
    block_d = min(triton.next_power_of_2(block_d), triton.next_power_of_2(max(d, 1)))
    return {"N": n, "NP": padded, "BD": block_d, "num_warps": 4 if padded <= 4 else 8}


class _Read(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weights, streams, block_d):
        tokens, n, d = streams.shape
        meta = launch_options(n, d, block_d, square=False)
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


# ----------------------------------------------------------------------------------------------
# Operand checks (shared with the write kernels) and the public wrapper (the reference's shapes)


def check_streams(streams: torch.Tensor) -> tuple[int, int]:
    """(n, d) of floating, non-float64 streams (..., n, d); a TypeError otherwise."""
    if not isinstance(streams, torch.Tensor) or not streams.is_floating_point() or streams.ndim < 2:
        raise TypeError("streams must be a floating torch.Tensor of shape (..., n, d)")
    if streams.dtype == torch.float64:
        raise TypeError(
            "streams are float64; the Triton kernels accumulate in float32 (use the PyTorch path)"
        )
    return streams.shape[-2], streams.shape[-1]


def per_token(name: str, tensor: torch.Tensor, batch: torch.Size, inner: tuple[int, ...]) -> torch.Tensor:
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
    """`naive_read_streams` as a kernel: x_in = H_pre X; weights (n,) static or (..., n) per token,
    X (..., n, d) -> (..., d) in X's dtype."""
    n, d = check_streams(streams)
    batch = streams.shape[:-2]
    flat_w = per_token("weights", weights, batch, (n,))
    out = _Read.apply(flat_w, streams.reshape(batch.numel(), n, d).contiguous(), block_d)
    return out.view(*batch, d)

"""TBP as autograd nodes: the anti-diagonal wavefront of `naive.tbp` in place, with a reverse-wavefront
backward written by hand (docs/ddl_mhc.md, 'Doubly-stochastic charts'). `TBPFunction` is the plain chart
"tbp"; `ScaledTBPFunction` the same wavefront with a `ScaledChoice` ("stbp", "mstbp";
docs/chart_variants.md). Their references are `naive.tbp` with the same choice.

The two stay separate nodes: the plain choice keeps its state float64 but its tape in the logits' dtype
(blocks of `_BLOCK` matrices), the scaled one needs the width inside the sigmoid, hence its tape in float64.
"""

import torch
from torch.autograd.function import once_differentiable

from geoformers.modeling.ops.charts.naive import ScaledChoice, anti_diagonals
from geoformers.modeling.ops.constant_cache import constant_cache

# ----------------------------------------------------------------------------------------------
# The plain chart
#
# Entry (i, j) reads the remaining row mass r (left neighbour), the remaining column mass c
# (entry above) and D = mass strictly below-right of (i, j-1) (left neighbour; D[i, -1] = n-1-i).
# Then L = max(0, c - D), U = min(r, c), X = L + (U - L) sigmoid(t), and it passes on r - X, c - X and
# D - (c - X). Entries on one anti-diagonal i + j = d are independent, so the (n-1)^2 steps become
# 2n-3 batched ones. Work arrays are batch-last in blocks of up to _BLOCK matrices,
# (blocks, entries, block): a diagonal is a strided view of whole rows and the transposes in and out
# stay in cache. The running sums are float64 because D reaches n-1 and float32 cancellation would
# break exactness at large n.

_BLOCK = 256


@constant_cache
def _below_right_start(n: int, device: torch.device) -> torch.Tensor:
    """D[i, -1] = n-1-i: the mass of the rows below row i, before any entry of row i."""
    return torch.arange(n - 1, 0, -1, dtype=torch.float64, device=device)


def _to_blocks(x: torch.Tensor, dtype: torch.dtype, block: int) -> torch.Tensor:
    """(B, k) -> (ceil(B / block), k, block) in `dtype`, zero-padded along the batch."""
    batch, k = x.shape
    blocks, full = -(-batch // block), batch // block
    out = torch.empty(blocks, k, block, dtype=dtype, device=x.device)
    out[:full].copy_(x[: full * block].view(full, block, k).transpose(1, 2))
    if full < blocks:
        out[full].zero_()
        out[full, :, : batch - full * block].copy_(x[full * block :].t())
    return out


def _from_blocks(x: torch.Tensor, dtype: torch.dtype, batch: int) -> torch.Tensor:
    """Inverse of `_to_blocks`: (blocks, k, block) -> (batch, k) in `dtype`."""
    blocks, k, block = x.shape
    out = torch.empty(blocks * block, k, dtype=dtype, device=x.device)
    out.view(blocks, block, k).copy_(x.transpose(1, 2))
    return out[:batch]


class TBPFunction(torch.autograd.Function):
    """TBP chart (docs/ddl_mhc.md, 'Doubly-stochastic charts') as one autograd node: wavefront forward,
    reverse-wavefront backward.

    The state (r, c, D) and X are float64; what the backward needs (sigmoid(t), U - L and the two
    branch masks) is kept in the logits' dtype, so the backward runs in float32 for float32 logits.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, n: int, out_dtype: torch.dtype, keep_for_backward: bool):
        batch = logits.shape[0]
        block = max(1, min(_BLOCK, batch))
        s = _to_blocks(torch.sigmoid(logits), logits.dtype, block)
        blocks = s.shape[0]
        x = s.new_empty(blocks, n, n, block, dtype=torch.float64)
        x_flat = x.view(blocks, n * n, block)
        r = x[:, : n - 1, n - 1]
        r.fill_(1)
        c_rev = torch.ones_like(r)
        below = torch.empty_like(r).copy_(_below_right_start(n, r.device)[None, :, None].expand_as(r))
        if keep_for_backward:
            width, takes_col, low_active = torch.empty_like(s), torch.empty_like(s), torch.empty_like(s)
        step = max(n - 2, 1)
        for d, first, last in anti_diagonals(n):
            cells = slice(d + first * (n - 2), d + last * (n - 2) + 1, step)
            r_d, below_d = r[:, first : last + 1], below[:, first : last + 1]
            c_d = c_rev[:, n - 2 - d + first : n - 1 - d + last]
            x_d = x_flat[:, d + first * (n - 1) : d + last * (n - 1) + 1 : n - 1]
            low = torch.sub(c_d, below_d)
            high = torch.minimum(r_d, c_d)
            if keep_for_backward:
                low_active[:, cells].copy_(low > 0)
                takes_col[:, cells].copy_(r_d > c_d)
            low.clamp_(min=0)
            high.sub_(low)
            if keep_for_backward:
                width[:, cells].copy_(high)
            x_d.copy_(low).addcmul_(high, s[:, cells])
            r_d.sub_(x_d)
            c_d.sub_(x_d)
            below_d.sub_(c_d)
        x[:, n - 1, : n - 1] = c_rev.flip(1)
        x[:, n - 1, n - 1].copy_(1 - r.sum(1))
        x.clamp_(min=0)  # remainders may round to -1e-16; the backward treats this as the identity
        if keep_for_backward:
            ctx.save_for_backward(s, width, takes_col, low_active)
        ctx.n, ctx.batch = n, batch
        return _from_blocks(x_flat, out_dtype, batch).view(batch, n, n)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: torch.Tensor) -> tuple:
        s, width, takes_col, low_active = ctx.saved_tensors
        n = ctx.n
        grad_flat = _to_blocks(grad_output.reshape(ctx.batch, n * n), s.dtype, s.shape[-1])
        grad = grad_flat.view(-1, n, n, s.shape[-1])
        grad_r = grad[:, : n - 1, n - 1] - grad[:, n - 1, n - 1, None]  # corner = 1 - sum_i r_i
        grad_c_rev = grad[:, n - 1, : n - 1].flip(1)
        grad_below = torch.zeros_like(grad_r)
        # Partial derivatives of X = L (1 - s) + U s with L = max(0, c - D), U = min(r, c).
        one_minus_s = 1 - s
        low_slope = low_active * one_minus_s
        s_col = s * takes_col
        dx_dr = s - s_col
        dx_dc = s_col.add_(low_slope)
        grad_x = torch.empty_like(s)
        step = max(n - 2, 1)
        for d, first, last in reversed(anti_diagonals(n)):
            cells = slice(d + first * (n - 2), d + last * (n - 2) + 1, step)
            g_r, g_below = grad_r[:, first : last + 1], grad_below[:, first : last + 1]
            g_c = grad_c_rev[:, n - 2 - d + first : n - 1 - d + last]
            g_x = grad_x[:, cells]
            g_c.sub_(g_below)  # D' = D - c'
            grad_x_out = grad_flat[:, d + first * (n - 1) : d + last * (n - 1) + 1 : n - 1]
            g_x.copy_(grad_x_out).sub_(g_r).sub_(g_c)  # r' = r - x, c' = c - x
            g_r.addcmul_(g_x, dx_dr[:, cells])
            g_c.addcmul_(g_x, dx_dc[:, cells])
            g_below.addcmul_(g_x, low_slope[:, cells], value=-1)
        grad_x.mul_(width).mul_(s).mul_(one_minus_s)
        return _from_blocks(grad_x, s.dtype, ctx.batch), None, None, None


def tbp_node(logits: torch.Tensor, n: int, out_dtype: torch.dtype) -> torch.Tensor:
    """TBP on logits (B, (n-1)^2), n >= 2, -> (B, n, n) in out_dtype through `TBPFunction`."""
    return TBPFunction.apply(logits, n, out_dtype, torch.is_grad_enabled() and logits.requires_grad)


# ----------------------------------------------------------------------------------------------
# The scaled and margined choices


class ScaledTBPFunction(torch.autograd.Function):
    """TBP with a `ScaledChoice` as one autograd node (the fast path of "stbp" / "mstbp"; `naive.tbp` with
    the choice is its reference): the wavefront in place, float64 batch-last, a reverse-wavefront backward.

    With x = L + W f, W = U - L, W+ = max(W, 0), f = rho + (1 - 2 rho) s, s = sigmoid(a) and
    a = beta t / (W+ + eps):
        dx/dt = W (1 - 2 rho) s (1 - s) beta / (W+ + eps),
        g = dx/dU = f - (1 - 2 rho) s (1 - s) a W+ / (W+ + eps),   dx/dL = 1 - g;
    through L = max(0, c - D) and U = min(r, c) these reach r, c and D as in TBP's backward.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, n: int, beta: float, eps: float, rho: float, keep: bool):
        batch = logits.shape[0]
        t = logits.t().contiguous()
        x = t.new_empty(n * n, batch)
        rows = t.new_ones(n - 1, batch)
        cols_reversed = t.new_ones(n - 1, batch)
        below = torch.arange(n - 1, 0, -1, dtype=t.dtype, device=t.device)[:, None].expand(-1, batch).clone()
        if keep:
            slope_t, slope_high, takes_col, low_active = (torch.empty_like(t) for _ in range(4))
        step, span = max(n - 2, 1), 1 - 2 * rho
        for d, first, last in anti_diagonals(n):
            cells = slice(d + first * (n - 2), d + last * (n - 2) + 1, step)
            r, below_d = rows[first : last + 1], below[first : last + 1]
            c = cols_reversed[n - 2 - d + first : n - 1 - d + last]
            low = c - below_d
            high = torch.minimum(r, c)
            if keep:
                low_active[cells] = low > 0
                takes_col[cells] = r > c
            low.clamp_(min=0)
            width = high - low
            denominator = width.clamp(min=0) + eps
            argument = beta * t[cells] / denominator
            s = torch.sigmoid(argument)
            fraction = rho + span * s
            if keep:
                curvature = span * s * (1 - s) / denominator
                slope_t[cells] = curvature * width * beta
                slope_high[cells] = fraction - curvature * argument * width.clamp(min=0)
            x_d = low.addcmul_(width, fraction)
            x[d + first * (n - 1) : d + last * (n - 1) + 1 : n - 1] = x_d
            r.sub_(x_d)
            c.sub_(x_d)
            below_d.sub_(c)
        square = x.view(n, n, batch)
        square[: n - 1, n - 1] = rows
        square[n - 1, : n - 1] = cols_reversed.flip(0)
        square[n - 1, n - 1] = 1 - rows.sum(0)
        if keep:
            ctx.save_for_backward(slope_t, slope_high, takes_col, low_active)
        ctx.n = n
        return square.permute(2, 0, 1)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: torch.Tensor) -> tuple:
        slope_t, slope_high, takes_col, low_active = ctx.saved_tensors
        n = ctx.n
        grad = grad_output.permute(1, 2, 0).reshape(n * n, -1)
        square = grad.view(n, n, -1)
        grad_rows = square[: n - 1, n - 1] - square[n - 1, n - 1]  # corner = 1 - sum_i r_i
        grad_cols_reversed = square[n - 1, : n - 1].flip(0)
        grad_below = torch.zeros_like(grad_rows)
        low_slope = (1 - slope_high) * low_active  # dx/dc through L, -dx/dD
        dx_dr = slope_high * (1 - takes_col)
        dx_dc = slope_high * takes_col + low_slope
        grad_t = torch.empty_like(slope_t)
        step = max(n - 2, 1)
        for d, first, last in reversed(anti_diagonals(n)):
            cells = slice(d + first * (n - 2), d + last * (n - 2) + 1, step)
            g_r, g_below = grad_rows[first : last + 1], grad_below[first : last + 1]
            g_c = grad_cols_reversed[n - 2 - d + first : n - 1 - d + last]
            g_c.sub_(g_below)  # D' = D - c'
            grad_x_out = grad[d + first * (n - 1) : d + last * (n - 1) + 1 : n - 1]
            g_x = grad_x_out - g_r - g_c  # r' = r - x, c' = c - x
            g_r.addcmul_(g_x, dx_dr[cells])
            g_c.addcmul_(g_x, dx_dc[cells])
            g_below.addcmul_(g_x, low_slope[cells], value=-1)
            grad_t[cells] = g_x * slope_t[cells]
        return grad_t.t(), None, None, None, None, None


def scaled_tbp_node(logits: torch.Tensor, n: int, choice: ScaledChoice) -> torch.Tensor:
    """TBP with `choice` (float64 logits (B, (n-1)^2) -> (B, n, n)) through `ScaledTBPFunction`."""
    if n == 1:
        return (logits.sum(-1) + 1)[:, None, None]
    keep = torch.is_grad_enabled() and logits.requires_grad
    return ScaledTBPFunction.apply(logits, n, choice.beta, choice.eps, choice.rho, keep)

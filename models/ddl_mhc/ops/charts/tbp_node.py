"""TBP as one autograd node for every interval choice: the anti-diagonal wavefront of `naive.tbp` in place,
with a reverse-wavefront backward written by hand (docs/ddl_mhc.md, 'Doubly-stochastic charts';
docs/chart_variants.md). It runs "tbp", "stbp", "mstbp" and the charts averaged in "atbp"; its reference is
`naive.tbp` with the same choice.

TBP stays a wavefront instead of running the level schedule of `schedule.py` (as RTBP does in
`rtbp_node.py`): a TBP point reads the running masses r, c, D, which as affine forms over the earlier points
have O(K) terms, so the schedule does O(K^2) work per matrix where the wavefront does O(K); with a gradient
it measured no faster at n = 4 and 1.1x to 3.4x slower from n = 8 on (docs/chart_variants.md,
'Implementation').
"""

import torch
from torch.autograd.function import once_differentiable

from geoformers.models.ddl_mhc.ops.charts.naive import PLAIN, ScaledChoice, anti_diagonals
from geoformers.models.ddl_mhc.ops.constant_cache import constant_cache

# ----------------------------------------------------------------------------------------------
# Entry (i, j) reads the remaining row mass r (left neighbour), the remaining column mass c
# (entry above) and D = mass strictly below-right of (i, j-1) (left neighbour; D[i, -1] = n-1-i).
# Then L = max(0, c - D), U = min(r, c), X = L + (U - L) f(t) with the choice's fraction f, and it passes
# on r - X, c - X and D - (c - X). Entries on one anti-diagonal i + j = d are independent, so the (n-1)^2
# steps become 2n-3 batched ones. Work arrays are batch-last in blocks of up to _BLOCK matrices,
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
    """TBP with an interval `choice` (`PLAIN` or a `ScaledChoice`) as one autograd node: wavefront forward,
    reverse-wavefront backward.

    The state (r, c, D) and X are float64. The tape holds per entry the sigmoid s, the width W = U - L and
    the two branch masks; for the plain choice in the logits' dtype (the backward runs in float32 for
    float32 logits), for a scaled one in float64 with the logits t. With x = L + W f:
      plain:  f = s = sigmoid(t),  dx/dU = s,  dx/dt = W s (1 - s);
      scaled: f = rho + (1 - 2 rho) s, s = sigmoid(a), a = beta t / (W+ + eps), W+ = max(W, 0),
              dx/dU = g = f - (1 - 2 rho) s (1 - s) a W+ / (W+ + eps),
              dx/dt = W (1 - 2 rho) s (1 - s) beta / (W+ + eps);
    dx/dL = 1 - dx/dU, and through L = max(0, c - D), U = min(r, c) these reach r, c and D.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, n: int, out_dtype: torch.dtype, choice, keep_for_backward: bool):
        batch = logits.shape[0]
        block = max(1, min(_BLOCK, batch))
        scaled = isinstance(choice, ScaledChoice)
        # the plain choice's sigmoids, or the scaled choice's logits
        s = _to_blocks(
            logits if scaled else torch.sigmoid(logits), torch.float64 if scaled else logits.dtype, block
        )
        blocks = s.shape[0]
        x = s.new_empty(blocks, n, n, block, dtype=torch.float64)
        x_flat = x.view(blocks, n * n, block)
        r = x[:, : n - 1, n - 1]
        r.fill_(1)
        c_rev = torch.ones_like(r)
        below = torch.empty_like(r).copy_(_below_right_start(n, r.device)[None, :, None].expand_as(r))
        if keep_for_backward:
            width, takes_col, low_active = torch.empty_like(s), torch.empty_like(s), torch.empty_like(s)
            sigmoids = torch.empty_like(s) if scaled else s
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
            if scaled:  # `ScaledChoice.point`
                fraction = torch.sigmoid_(s[:, cells] * choice.beta / high.clamp(min=0).add_(choice.eps))
                if keep_for_backward:
                    sigmoids[:, cells].copy_(fraction)
                if choice.rho:
                    fraction = fraction.mul_(1 - 2 * choice.rho).add_(choice.rho)
            else:
                fraction = s[:, cells]
            x_d.copy_(low).addcmul_(high, fraction)
            r_d.sub_(x_d)
            c_d.sub_(x_d)
            below_d.sub_(c_d)
        x[:, n - 1, : n - 1] = c_rev.flip(1)
        x[:, n - 1, n - 1].copy_(1 - r.sum(1))
        x.clamp_(min=0)  # remainders may round to -1e-16; the backward treats this as the identity
        if keep_for_backward:
            ctx.save_for_backward(s, sigmoids, width, takes_col, low_active)
        ctx.n, ctx.batch, ctx.choice, ctx.in_dtype = n, batch, choice, logits.dtype
        return _from_blocks(x_flat, out_dtype, batch).view(batch, n, n)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: torch.Tensor) -> tuple:
        t, s, width, takes_col, low_active = ctx.saved_tensors
        n, choice = ctx.n, ctx.choice
        grad_flat = _to_blocks(grad_output.reshape(ctx.batch, n * n), s.dtype, s.shape[-1])
        grad = grad_flat.view(-1, n, n, s.shape[-1])
        grad_r = grad[:, : n - 1, n - 1] - grad[:, n - 1, n - 1, None]  # corner = 1 - sum_i r_i
        grad_c_rev = grad[:, n - 1, : n - 1].flip(1)
        grad_below = torch.zeros_like(grad_r)
        if isinstance(choice, ScaledChoice):  # the derivatives of the class docstring
            span, clamped = 1 - 2 * choice.rho, width.clamp(min=0)
            denominator = clamped + choice.eps
            curvature = s * (1 - s) * span / denominator
            slope_high = s * span + choice.rho - curvature * (t * choice.beta / denominator) * clamped
            slope_t = curvature.mul_(width).mul_(choice.beta)
        else:
            slope_high, slope_t = s, None
        # Partial derivatives of X = L (1 - g) + U g with L = max(0, c - D), U = min(r, c), g = dx/dU.
        one_minus_g = 1 - slope_high
        low_slope = low_active * one_minus_g
        g_col = slope_high * takes_col
        dx_dr = slope_high - g_col
        dx_dc = g_col.add_(low_slope)
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
        if slope_t is None:
            grad_x.mul_(width).mul_(s).mul_(one_minus_g)  # dx/dt = W s (1 - s)
        else:
            grad_x.mul_(slope_t)
        return _from_blocks(grad_x, ctx.in_dtype, ctx.batch), None, None, None, None


def tbp_node(logits: torch.Tensor, n: int, out_dtype: torch.dtype, choice=PLAIN) -> torch.Tensor:
    """TBP with the interval `choice`: logits (B, (n-1)^2) -> (B, n, n) in out_dtype through `TBPFunction`."""
    if n == 1:
        return (logits.to(out_dtype).sum(-1) + 1)[:, None, None]
    return TBPFunction.apply(logits, n, out_dtype, choice, torch.is_grad_enabled() and logits.requires_grad)

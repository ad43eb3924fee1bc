"""The TBP-mHC authors' variants of the transport charts (docs/chart_variants.md). Importing this module
registers them in `birkhoff.CHART_VARIANTS`, so `birkhoff(logits, n, method)` and `num_logits` take their
names (with the checks, float64 arithmetic, autocast off and observers of the other charts):

- "stbp", "srtbp" (the authors' STBP, SRTBP): TBP and RTBP with the scaled interval choice
      x = L + (U - L) sigmoid(beta t / (U - L + eps)),  beta = SCALED_BETA, eps = SCALED_EPS;
- "mstbp", "msrtbp" (MSTBP, MSRTDP2N): the margined choice, the fraction of the interval kept in
  [rho, 1 - rho]:  x = L + (U - L) (rho + (1 - 2 rho) sigmoid(beta t / (U - L + eps))),  rho = MARGIN_RHO;
- "atbp" (ATBP): H = sum_k softmax(w)_k P_k^T TBP(t_k) P_k over the orderings ATBP_ORDERINGS, each with its
  own logits: [w (K), t_1, ..., t_K ((n-1)^2 each)], K (n-1)^2 + K in all.

The interval variants move the point chosen in each feasible interval [L, U] of TBP/RTBP, not the
intervals, so they stay exact. `tbp_with_choice` (TBP's anti-diagonal wavefront) and `rtbp_with_choice`
(RTBP's recursion) are plain-autograd forms of the two charts with the choice plugged in; with the plain
choice L + (U - L) sigmoid(t) they equal `birkhoff(..., "tbp")` and `birkhoff(..., "rtbp")` (tests).
"srtbp" and "msrtbp" run `rtbp_with_choice`; "stbp" and "mstbp" run `_ScaledTBPFunction`, the same
wavefront with a hand-written backward, whose reference is `tbp_with_choice`. `variant_logits_from_matrix`
inverts the four interval variants; ATBP (a mixture) has no inverse.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial

import torch
from torch.autograd.function import once_differentiable

from geoformers.modeling.birkhoff import (
    CHART_VARIANTS,
    ChartVariant,
    _check_interior_ds,
    _diagonals,
    _tbp,
    rtbp_logits_from_matrix,
    tbp_logits_from_matrix,
)

SCALED_BETA = 4.0  # the authors' STBP/SRTBP/MSTBP/MSRTDP2N defaults
SCALED_EPS = 1e-3
MARGIN_RHO = 1e-4  # the authors' MSTBP and MSRTDP2N margin
ATBP_ORDERINGS = ("direct", "reverse")  # the authors' default orderings: pi = (0, ..., n-1) and (n-1, ..., 0)

# The choice of a point in each feasible interval: (low, high, logit) -> point in [low, high].
PointInInterval = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

__all__ = [
    "ATBP_ORDERINGS",
    "INTERVAL_VARIANTS",
    "MARGIN_RHO",
    "SCALED_BETA",
    "SCALED_EPS",
    "ScaledChoice",
    "atbp",
    "rtbp_with_choice",
    "tbp_with_choice",
    "variant_logits_from_matrix",
]


@dataclass(frozen=True)
class ScaledChoice:
    """x = L + (U - L) (rho + (1 - 2 rho) sigmoid(beta t / (U - L + eps))) in each interval [L, U]
    (docs/chart_variants.md, "Scaled and margined interval choice"); rho = 0 is the scaled choice."""

    beta: float = SCALED_BETA
    eps: float = SCALED_EPS
    rho: float = 0.0

    def __post_init__(self):
        for name, value, low, high in (("beta", self.beta, 0.0, math.inf), ("eps", self.eps, 0.0, math.inf)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not low < value < high:
                raise ValueError(f"ScaledChoice `{name}` must be a finite number > 0, got {value!r}")
        if not isinstance(self.rho, (int, float)) or isinstance(self.rho, bool) or not 0 <= self.rho < 0.5:
            raise ValueError(f"ScaledChoice `rho` must lie in [0, 0.5), got {self.rho!r}")

    def point(self, low: torch.Tensor, high: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The chosen point; the width in the denominator is clamped at 0 (it rounds to about -1e-16 on a
        collapsed interval), so the division is by at least eps."""
        width = (high - low).clamp_min(0)
        fraction = torch.sigmoid(self.beta * logits / (width + self.eps))
        return torch.lerp(low, high, self.rho + (1 - 2 * self.rho) * fraction)

    def logit(self, value: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
        """Inverse of `point` for `value` in [L + rho (U - L), U - rho (U - L)]; ValueError for a value
        outside that margin, which no logit reaches."""
        width = (high - low).clamp_min(0)
        ratio = (value - low) / width.clamp_min(torch.finfo(value.dtype).tiny)
        fraction = (ratio - self.rho) / (1 - 2 * self.rho)
        if self.rho > 0 and bool(((fraction < -1e-6) | (fraction > 1 + 1e-6)).any()):
            raise ValueError(
                f"`matrices` lie outside the margined chart's image: an entry is within rho = {self.rho:g} "
                "of its interval's ends (as a fraction of the interval), which no logit reaches"
            )
        eps = torch.finfo(value.dtype).eps
        return torch.logit(fraction.clamp(eps, 1 - eps)) * (width + self.eps) / self.beta


# ----------------------------------------------------------------------------------------------
# TBP with a pluggable choice: the anti-diagonal wavefront of `birkhoff._TBPFunction`, in plain autograd
#
# Entry (i, j) reads the remaining row mass r_i, the remaining column mass c_j and D_i = the mass of rows
# below i in columns >= j; L = max(0, c_j - D_i), U = min(r_i, c_j); it passes on r_i - x, c_j - x and
# D_i - (c_j - x). The entries of one anti-diagonal are independent, so each diagonal is one batched step.


@cache
def _row_major_from_diagonals(n: int, device: torch.device) -> torch.Tensor:
    """Positions, in anti-diagonal order, of the (n-1)^2 logit cells listed in row-major order."""
    order = [d + i * (n - 2) for d, first, last in _diagonals(n) for i in range(first, last + 1)]
    return torch.tensor(order, device=device).argsort()


def _replace(x: torch.Tensor, start: int, values: torch.Tensor) -> torch.Tensor:
    """x with columns start, start + 1, ... replaced by `values` (out of place, for autograd)."""
    return torch.cat([x[:, :start], values, x[:, start + values.shape[1] :]], 1)


def tbp_with_choice(logits: torch.Tensor, n: int, point: PointInInterval) -> torch.Tensor:
    """TBP (docs/chart_variants.md) with `point` choosing each entry in its interval: float64 logits
    (B, (n-1)^2), row-major over the north-west (n-1) x (n-1) block, -> (B, n, n)."""
    if n == 1:
        return (logits.sum(-1) + 1)[:, None, None]
    batch = logits.shape[0]
    rows = logits.new_ones(batch, n - 1)
    cols_reversed = logits.new_ones(batch, n - 1)  # c_{n-2}, ..., c_0: a diagonal's columns ascend here
    below = torch.arange(n - 1, 0, -1, dtype=logits.dtype, device=logits.device).expand(batch, -1)
    entries = []
    for d, first, last in _diagonals(n):
        count, col_start = last - first + 1, n - 2 - d + first
        r = rows[:, first : last + 1]
        c = cols_reversed[:, col_start : col_start + count]
        cells = logits[:, d + first * (n - 2) : d + last * (n - 2) + 1 : max(n - 2, 1)]
        x = point(torch.relu(c - below[:, first : last + 1]), torch.minimum(r, c), cells)
        rows = _replace(rows, first, r - x)
        cols_reversed = _replace(cols_reversed, col_start, c - x)
        below = _replace(below, first, below[:, first : last + 1] - (c - x))
        entries.append(x)
    inner = torch.cat(entries, 1)[:, _row_major_from_diagonals(n, logits.device)].view(batch, n - 1, n - 1)
    last_row = torch.cat([cols_reversed.flip(1), 1 - rows.sum(1, keepdim=True)], 1)
    return torch.cat([torch.cat([inner, rows[:, :, None]], 2), last_row[:, None]], 1)


class _ScaledTBPFunction(torch.autograd.Function):
    """TBP with a `ScaledChoice` as one autograd node (the fast path of "stbp" / "mstbp"; `tbp_with_choice`
    is its reference): the wavefront above in place, batch-last, and a reverse-wavefront backward.

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
        for d, first, last in _diagonals(n):
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
        for d, first, last in reversed(_diagonals(n)):
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


def _scaled_tbp(logits: torch.Tensor, n: int, choice: "ScaledChoice") -> torch.Tensor:
    """TBP with `choice` (float64 logits (B, (n-1)^2) -> (B, n, n)) through `_ScaledTBPFunction`."""
    if n == 1:
        return (logits.sum(-1) + 1)[:, None, None]
    keep = torch.is_grad_enabled() and logits.requires_grad
    return _ScaledTBPFunction.apply(logits, n, choice.beta, choice.eps, choice.rho, keep)


# ----------------------------------------------------------------------------------------------
# RTBP with a pluggable choice: the recursion of `birkhoff._rtbp_transport`, in plain autograd, same logit
# layout (docs/chart_variants.md, "RTBP and the authors' RTBP2N")


def _split_with_choice(
    capacities: torch.Tensor, total: torch.Tensor, logits: torch.Tensor, point: PointInInterval
) -> torch.Tensor:
    """Split `total` (Q,) over slots 0 <= x <= capacities (Q, m) with logits (Q, m-1): the first ceil(m/2)
    slots get a mass in [max(0, total - cap(second half)), min(total, cap(first half))], then both halves
    recurse (one batched call when m is even). Logits: [this split, first half's, second half's]."""
    q, m = capacities.shape
    if m == 1:
        return total[:, None]
    half = (m + 1) // 2
    first_caps, second_caps = capacities[:, :half], capacities[:, half:]
    low = torch.relu(total - second_caps.sum(1))
    first = point(low, torch.minimum(total, first_caps.sum(1)), logits[:, 0])
    if m % 2 == 0:
        halves = _split_with_choice(
            capacities.reshape(2 * q, half),
            torch.stack([first, total - first], 1).view(2 * q),
            logits[:, 1:].reshape(2 * q, half - 1),
            point,
        )
        return halves.view(q, m)
    return torch.cat(
        [
            _split_with_choice(first_caps, first, logits[:, 1:half], point),
            _split_with_choice(second_caps, total - first, logits[:, half:], point),
        ],
        1,
    )


def _transport_with_choice(
    rows: torch.Tensor, cols: torch.Tensor, logits: torch.Tensor, point: PointInInterval
) -> torch.Tensor:
    """RTBP on P square transport problems: marginals (P, n), logits (P, (n-1)^2) -> plans (P, n, n).
    Odd n: the last column, then the rest of the last row, then the (n-1) x (n-1) rest. Even n: the
    top-left block mass, four splits of it over rows and columns, then the four blocks."""
    p_count, n = rows.shape
    if n == 1:
        return rows[:, :, None]
    if n % 2 == 1:
        logits_col, logits_row, logits_inner = logits.split([n - 1, n - 2, (n - 2) ** 2], 1)
        last_col = _split_with_choice(rows, cols[:, -1], logits_col, point)
        corner = last_col[:, -1:]
        last_row = _split_with_choice(cols[:, :-1], rows[:, -1] - corner[:, 0], logits_row, point)
        inner_rows, inner_cols = rows[:, :-1] - last_col[:, :-1], cols[:, :-1] - last_row
        inner = _transport_with_choice(inner_rows, inner_cols, logits_inner, point)
        top = torch.cat([inner, last_col[:, :-1, None]], 2)
        return torch.cat([top, torch.cat([last_row, corner], 1)[:, None]], 1)
    h = n // 2
    top, bottom, left, right = rows[:, :h], rows[:, h:], cols[:, :h], cols[:, h:]
    logits_block, logits_splits, logits_children = logits.split([1, 4 * (h - 1), 4 * (h - 1) ** 2], 1)
    top_mass, left_mass = top.sum(1), left.sum(1)
    low = torch.relu(top_mass - right.sum(1))
    mass_tl = point(low, torch.minimum(top_mass, left_mass), logits_block[:, 0])
    # Four splits in one batched call: top rows -> TL, bottom rows -> BL, left cols -> TL, right cols -> TR.
    shares = _split_with_choice(
        torch.stack([top, bottom, left, right], 1).view(4 * p_count, h),
        torch.stack([mass_tl, left_mass - mass_tl, mass_tl, top_mass - mass_tl], 1).view(4 * p_count),
        logits_splits.reshape(4 * p_count, h - 1),
        point,
    ).view(p_count, 4, h)
    rows_tl, rows_bl, cols_tl, cols_tr = shares.unbind(1)
    children = _transport_with_choice(
        torch.stack([rows_tl, top - rows_tl, rows_bl, bottom - rows_bl], 1).view(4 * p_count, h),
        torch.stack([cols_tl, cols_tr, left - cols_tl, right - cols_tr], 1).view(4 * p_count, h),
        logits_children.reshape(4 * p_count, (h - 1) ** 2),
        point,
    )
    return children.view(p_count, 2, 2, h, h).transpose(2, 3).reshape(p_count, n, n)


def rtbp_with_choice(logits: torch.Tensor, n: int, point: PointInInterval) -> torch.Tensor:
    """RTBP (docs/chart_variants.md) with `point` choosing every block mass and split: float64 logits
    (B, (n-1)^2) -> (B, n, n)."""
    if n == 1:
        return (logits.sum(-1) + 1)[:, None, None]
    ones = logits.new_ones(logits.shape[0], n)
    return _transport_with_choice(ones, ones, logits, point)


# ----------------------------------------------------------------------------------------------
# ATBP: permutation average of TBP


@cache
def _atbp_inverse_orderings(n: int, device: torch.device) -> torch.Tensor:
    """pi_k^{-1} for each ordering of ATBP_ORDERINGS, (K, n): (P^T M P)[pi(i), pi(j)] = M[i, j] reads M at
    (pi^{-1}(a), pi^{-1}(b))."""
    orderings = {"direct": list(range(n)), "reverse": list(range(n - 1, -1, -1))}
    return torch.tensor([orderings[name] for name in ATBP_ORDERINGS], device=device).argsort(1)


def _atbp_num_logits(n: int) -> int:
    return len(ATBP_ORDERINGS) * ((n - 1) ** 2 + 1)


def atbp(logits: torch.Tensor, n: int) -> torch.Tensor:
    """ATBP (docs/chart_variants.md): H = sum_k softmax(w)_k P_k^T TBP(t_k) P_k, float64 logits
    (B, K + K (n-1)^2) laid out [w, t_1, ..., t_K] -> (B, n, n). The K charts are one call of the fast TBP."""
    k = len(ATBP_ORDERINGS)
    weights = torch.softmax(logits[:, :k], -1)
    if n == 1:
        return weights.sum(-1)[:, None, None]
    batch = logits.shape[0]
    charts = _tbp(logits[:, k:].reshape(batch * k, (n - 1) ** 2), n, logits.dtype).view(batch, k, n, n)
    inverse = _atbp_inverse_orderings(n, logits.device)
    conjugated = [charts[:, i].index_select(1, pi).index_select(2, pi) for i, pi in enumerate(inverse)]
    return (weights[:, :, None, None] * torch.stack(conjugated, 1)).sum(1)


# ----------------------------------------------------------------------------------------------
# Registration and the inverse of the interval variants

SCALED = ScaledChoice()
MARGINED = ScaledChoice(rho=MARGIN_RHO)
# method -> (the chart it varies, its interval choice)
INTERVAL_VARIANTS = {
    "stbp": ("tbp", SCALED),
    "srtbp": ("rtbp", SCALED),
    "mstbp": ("tbp", MARGINED),
    "msrtbp": ("rtbp", MARGINED),
}


def _transport_num_logits(n: int) -> int:
    return (n - 1) ** 2


CHART_VARIANTS.update(
    stbp=ChartVariant(_transport_num_logits, partial(_scaled_tbp, choice=SCALED)),
    srtbp=ChartVariant(_transport_num_logits, partial(rtbp_with_choice, point=SCALED.point)),
    mstbp=ChartVariant(_transport_num_logits, partial(_scaled_tbp, choice=MARGINED)),
    msrtbp=ChartVariant(_transport_num_logits, partial(rtbp_with_choice, point=MARGINED.point)),
    atbp=ChartVariant(_atbp_num_logits, atbp),
)


def variant_logits_from_matrix(matrices: torch.Tensor, method: str) -> torch.Tensor:
    """Inverse of an interval variant: strictly interior DS matrices (..., n, n) -> logits (..., (n-1)^2)
    with birkhoff(logits, n, method) == matrices (the inverse TBP/RTBP with the variant's choice inverted).
    The margined variants reach only matrices whose every entry keeps the margin (ValueError otherwise)."""
    if method not in INTERVAL_VARIANTS:
        raise ValueError(
            f"`method` must be one of {list(INTERVAL_VARIANTS)} (atbp, a mixture of charts, has no inverse), "
            f"got {method!r}"
        )
    _check_interior_ds(matrices, f"variant_logits_from_matrix(method={method!r})")
    base, choice = INTERVAL_VARIANTS[method]
    inverse = tbp_logits_from_matrix if base == "tbp" else rtbp_logits_from_matrix
    return inverse(matrices, choice.logit)

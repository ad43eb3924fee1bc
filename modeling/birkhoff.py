"""Doubly-stochastic charts: unconstrained logits -> a matrix in the Birkhoff polytope (docs/ddl_mhc.md,
'Doubly-stochastic charts').

B_n = {X >= 0, X 1 = 1, X^T 1 = 1}. `birkhoff(logits, n, method)` maps logits of shape
(..., num_logits(method, n)) to one matrix per leading index, shape (..., n, n):

- "tbp": transport Birkhoff polytope, north-west corner; (n-1)^2 logits; exact, onto the interior.
- "rtbp": recursive TBP (2x2 blocks, batched children); (n-1)^2 logits; exact, onto the interior.
- "sinkhorn": mHC, exp then `iters` row/column normalisations in log space; n^2 logits; approximate.
- "mhc_lite": softmax over the n! permutation matrices; n! logits; exact; n <= MHC_LITE_MAX_N.
- "kromhc": Kronecker product of log2(n) 2x2 factors [[s, 1-s], [1-s, s]]; exact; n = 2^k.
- "stbp", "srtbp", "mstbp", "msrtbp", "atbp": the TBP-mHC authors' variants of tbp and rtbp, defined in
  `chart_variants.py` (docs/chart_variants.md), which registers them in `CHART_VARIANTS` on import.

Also here: `ds_violation` (the measured max |row/column sum - 1|) and the inverse charts
`tbp_logits_from_matrix` / `rtbp_logits_from_matrix` (interior DS matrix -> logits, which shows
both charts reach every interior point). `birkhoff_reference.py` holds plain-Python float64
references of tbp and rtbp for the tests.

`register_chart_observer` lets training code see every chart an eager forward computes (the Sinkhorn
error monitor). Charts run with autocast disabled. The exact charts do their arithmetic in float64 (TBP/RTBP
running masses reach n-1 and would cancel in float32) and round the finished matrix once, so a
float32 result has |row/column sum - 1| <= ~6e-8 at any n; Sinkhorn runs in float32 like mHC.
The result is float32, or float64 for float64 logits.
"""

import itertools
import math
from collections import OrderedDict
from collections.abc import Callable
from functools import cache
from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable
from torch.utils.hooks import RemovableHandle

from geoformers.configuration.charts import METHODS, MHC_LITE_MAX_N
from geoformers.modeling.rtbp_function import rtbp
from geoformers.modeling.triton_dispatch import kernels

# Sinkhorn is approximate: after SINKHORN_DEFAULT_ITERS = 20 iterations the columns sum to 1 and the worst
# |row sum - 1| grows with the logits' scale (median / max over 4,096 float32 matrices, logits N(0, s^2)):
#     s      0.1             1               3               10
#     n=4    7.5e-8/1.6e-7   7.5e-8/1.3e-4   2.4e-4/4.7e-2   2.9e-2/3.7e-1
#     n=8    9.7e-8/2.5e-7   1.0e-7/1.7e-6   3.4e-4/5.5e-2   5.2e-2/4.9e-1
#     n=16   1.9e-7/3.3e-7   1.5e-7/1.6e-6   3.1e-4/4.6e-2   6.7e-2/4.6e-1
# `training.chart_monitor.ChartViolationCallback` logs it during training (warning above a tolerance).
SINKHORN_DEFAULT_ITERS = 20

__all__ = [
    "CHART_VARIANTS",
    "METHODS",
    "MHC_LITE_MAX_N",
    "SINKHORN_DEFAULT_ITERS",
    "birkhoff",
    "ds_violation",
    "num_logits",
    "register_chart_observer",
    "rtbp_logits_from_matrix",
    "tbp_logits_from_matrix",
]


def _check_method_and_n(method: str, n: int) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if method == "kromhc" and n & (n - 1):
        raise ValueError(f"kromhc needs n to be a power of two (n = 2^k), got n={n}")
    if method == "mhc_lite" and n > MHC_LITE_MAX_N:
        raise ValueError(
            f"mhc_lite needs n <= {MHC_LITE_MAX_N} ({math.factorial(MHC_LITE_MAX_N)} logits, one per "
            f"permutation), got n={n} ({math.factorial(n)} permutations)"
        )


def num_logits(method: str, n: int) -> int:
    """Number of logits per matrix: (n-1)^2 for tbp/rtbp, n^2 for sinkhorn, n! for mhc_lite,
    log2(n) for kromhc; a variant's own count (`chart_variants.py`)."""
    _check_method_and_n(method, n)
    if method in CHART_VARIANTS:
        return CHART_VARIANTS[method].num_logits(n)
    if method in ("tbp", "rtbp"):
        return (n - 1) ** 2
    if method == "sinkhorn":
        return n * n
    if method == "mhc_lite":
        return math.factorial(n)
    return n.bit_length() - 1


def ds_violation(matrices: torch.Tensor) -> torch.Tensor:
    """max(|X 1 - 1|, |X^T 1 - 1|) per matrix (shape X.shape[:-2]), summed in float64 so the
    measurement itself adds no float32 rounding."""
    if matrices.ndim < 2 or matrices.shape[-1] != matrices.shape[-2]:
        raise ValueError(f"ds_violation expects (..., n, n) matrices, got shape {tuple(matrices.shape)}")
    x = matrices.detach().to(torch.float64)
    rows = (x.sum(-1) - 1).abs().amax(-1)
    cols = (x.sum(-2) - 1).abs().amax(-1)
    return torch.maximum(rows, cols)


# ----------------------------------------------------------------------------------------------
# TBP: north-west corner, anti-diagonal wavefront with an analytic backward
#
# Entry (i, j) reads the remaining row mass r (left neighbour), the remaining column mass c
# (entry above) and D = mass strictly below-right of (i, j-1) (left neighbour; D[i, -1] = n-1-i).
# Then L = max(0, c - D) (the TBP interval's r_i - sum_{j'>j} c_j', rewritten; its third term
# c_j - sum_{i'>i} r_i' is <= 0 for unit marginals), U = min(r, c), X = L + (U - L) sigmoid(t),
# and it passes on r - X, c - X and D - (c - X). Entries on one anti-diagonal i + j = d are
# independent, so the (n-1)^2 steps become 2n-3 batched ones. Work arrays are batch-last in
# blocks of up to _BLOCK matrices, (blocks, entries, block): a diagonal is a strided view of whole
# rows and the transposes in and out stay in cache. The running sums are float64 because D
# reaches n-1 and float32 cancellation would break exactness at large n.

_BLOCK = 256


def _diagonals(n: int) -> list[tuple[int, int, int]]:
    """(d, first row, last row) of each anti-diagonal of the (n-1) x (n-1) logit grid."""
    return [(d, max(0, d - (n - 2)), min(d, n - 2)) for d in range(2 * n - 3)]


@cache
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


class _TBPFunction(torch.autograd.Function):
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
        for d, first, last in _diagonals(n):
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
        for d, first, last in reversed(_diagonals(n)):
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


def _tbp(logits: torch.Tensor, n: int, out_dtype: torch.dtype) -> torch.Tensor:
    """TBP (docs/ddl_mhc.md, 'Doubly-stochastic charts') on logits (B, (n-1)^2) -> (B, n, n) in out_dtype."""
    return _TBPFunction.apply(logits, n, out_dtype, torch.is_grad_enabled() and logits.requires_grad)


# ----------------------------------------------------------------------------------------------
# RTBP: recursive TBP
#
# Batch-last throughout: marginals (P, n, B) and sigmoid(logits) (P, (n-1)^2, B) for P transport
# problems, so every batched step works on whole contiguous rows of B values. Float64 because
# block masses reach n/2 and float32 cancellation would break exactness at large n.


def _interval_point(
    low: torch.Tensor, total: torch.Tensor, capacity: torch.Tensor, s: torch.Tensor
) -> torch.Tensor:
    """low + (high - low) s with high = min(total, capacity), written as total - relu(total - capacity)
    so that the backward is a threshold, not a masked select."""
    return torch.lerp(low, total - torch.relu(total - capacity), s)


def _split(capacities: torch.Tensor, total: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Split `total` (Q, B) over slots 0 <= x <= capacities (Q, m, B) with sigmoids s (Q, m-1, B):
    the first ceil(m/2) slots get a mass in [max(0, total - cap_2), min(total, cap_1)], then both
    halves recurse (one batched call when m is even)."""
    q, m, batch = capacities.shape
    if m == 1:
        return total[:, None]
    half = (m + 1) // 2
    first_caps, second_caps = capacities.split([half, m - half], 1)
    s_here, s_rest = s.split([1, m - 2], 1)
    low = torch.relu(total - second_caps.sum(1))
    first = _interval_point(low, total, first_caps.sum(1), s_here.squeeze(1))
    if m % 2 == 0:
        halves = _split(
            capacities.reshape(2 * q, half, batch),
            torch.stack([first, total - first], 1).view(2 * q, batch),
            s_rest.reshape(2 * q, half - 1, batch),
        )
        return halves.view(q, m, batch)
    s_first, s_second = s_rest.split([half - 1, m - half - 1], 1)
    return torch.cat([_split(first_caps, first, s_first), _split(second_caps, total - first, s_second)], 1)


def _rtbp_transport(rows: torch.Tensor, cols: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """RTBP (docs/ddl_mhc.md, 'Doubly-stochastic charts') on P square transport problems: marginals (P, n, B),
    sigmoids (P, (n-1)^2, B) -> plans (P, n, n, B)."""
    p_count, n, batch = rows.shape
    if n == 1:
        return rows[:, :, None]
    if n % 2 == 1:
        rows_head, row_last = rows.split([n - 1, 1], 1)
        cols_head, col_last = cols.split([n - 1, 1], 1)
        s_col, s_row, s_inner = s.split([n - 1, n - 2, (n - 2) ** 2], 1)
        last_col = _split(rows, col_last.squeeze(1), s_col)
        last_col_head, corner = last_col.split([n - 1, 1], 1)
        last_row = _split(cols_head, (row_last - corner).squeeze(1), s_row)
        inner = _rtbp_transport(rows_head - last_col_head, cols_head - last_row, s_inner)
        top = torch.cat([inner, last_col_head[:, :, None]], 2)
        return torch.cat([top, torch.cat([last_row, corner], 1)[:, None]], 1)
    h = n // 2
    top, bottom = rows.split(h, 1)
    left, right = cols.split(h, 1)
    s_block, s_splits, s_children = s.split([1, 4 * (h - 1), 4 * (h - 1) ** 2], 1)
    top_mass, left_mass = top.sum(1), left.sum(1)
    low = torch.relu(top_mass - right.sum(1))
    mass_tl = _interval_point(low, top_mass, left_mass, s_block.squeeze(1))
    # Four splits in one batched call: top rows -> TL, bottom rows -> BL, left cols -> TL, right cols -> TR.
    shares = _split(
        torch.stack([top, bottom, left, right], 1).view(4 * p_count, h, batch),
        torch.stack([mass_tl, left_mass - mass_tl, mass_tl, top_mass - mass_tl], 1).view(4 * p_count, batch),
        s_splits.reshape(4 * p_count, h - 1, batch),
    ).view(p_count, 4, h, batch)
    rows_tl, rows_bl, cols_tl, cols_tr = shares.unbind(1)
    child_rows = torch.stack([rows_tl, top - rows_tl, rows_bl, bottom - rows_bl], 1)
    child_cols = torch.stack([cols_tl, cols_tr, left - cols_tl, right - cols_tr], 1)
    children = _rtbp_transport(
        child_rows.view(4 * p_count, h, batch),
        child_cols.view(4 * p_count, h, batch),
        s_children.reshape(4 * p_count, (h - 1) ** 2, batch),
    )
    return children.view(p_count, 2, 2, h, h, batch).transpose(2, 3).reshape(p_count, n, n, batch)


def _nonnegative(x: torch.Tensor) -> torch.Tensor:
    """x with the remainders that round below zero (about -1e-16) set to 0, gradient unchanged (the
    straight-through identity, as TBP's backward): entries of an exact chart are >= 0 exactly."""
    return x + (x.clamp_min(0) - x).detach()


def _rtbp_autograd(logits: torch.Tensor, n: int) -> torch.Tensor:
    """RTBP on float64 logits (B, (n-1)^2) -> (B, n, n) with plain autograd (docs/rtbp_backward.md): the
    reference of `rtbp_function.RTBPFunction`, which `birkhoff` runs."""
    s = torch.sigmoid(logits).t().contiguous()[None]
    ones = s.new_ones(1, n, s.shape[-1])
    return _nonnegative(_rtbp_transport(ones, ones, s)[0].permute(2, 0, 1))


# ----------------------------------------------------------------------------------------------
# Sinkhorn (mHC), mHC-lite, KromHC


def _logsumexp(z: torch.Tensor, dim: int) -> torch.Tensor:
    """log sum exp over `dim`, shifted by the (constant) max so exp cannot overflow."""
    shift = z.detach().amax(dim, keepdim=True)
    return shift + (z - shift).exp().sum(dim, keepdim=True).log()


def _sinkhorn(logits: torch.Tensor, n: int, iters: int) -> torch.Tensor:
    """mHC: exp(logits) then `iters` row and column normalisations, in log space (batch-last
    layout, so both reductions run over outer dimensions).

    Every entry is first shifted by its matrix's largest logit (the result does not change: a constant
    factor of exp(logits) cancels in the first normalisation) and kept above -max/4 of the dtype. Each
    normalisation maps entries into [-(spread + log n), 0], so with the spread bounded no difference
    overflows and no row or column becomes all -inf (whose normalisation is inf - inf = NaN): the chart
    is finite for every finite logit, e.g. +-2e38 in float32 or +-1e308 in float64. Only logits more
    than max/4 below their matrix's largest (exp of which is 0 in any dtype) are moved."""
    floor = torch.finfo(logits.dtype).max / 4
    shifted = (logits - logits.detach().amax(-1, keepdim=True)).clamp_min(-floor)
    z = shifted.t().reshape(n, n, -1).contiguous()
    for _ in range(iters):
        z = z - _logsumexp(z, 1)
        z = z - _logsumexp(z, 0)
    return z.exp().permute(2, 0, 1)


@cache
def _permutation_matrices(n: int) -> torch.Tensor:
    """All n! permutation matrices, flattened: (n!, n*n), lexicographic order of itertools."""
    perms = torch.tensor(list(itertools.permutations(range(n))), dtype=torch.long)
    eye = torch.eye(n, dtype=torch.float64)
    return eye[perms].reshape(len(perms), n * n)


def _mhc_lite(logits: torch.Tensor, n: int) -> torch.Tensor:
    """mHC-lite: softmax weights over the n! permutation matrices (Birkhoff-von Neumann)."""
    perms = _permutation_matrices(n).to(device=logits.device, dtype=logits.dtype)
    return (torch.softmax(logits, -1) @ perms).reshape(-1, n, n)


def _kromhc(logits: torch.Tensor, n: int) -> torch.Tensor:
    """KromHC: X = F_1 (x) ... (x) F_k, F = [[s, 1-s], [1-s, s]], s = sigmoid(logit)."""
    s = torch.sigmoid(logits)
    x = logits.new_ones(logits.shape[0], 1, 1)
    for k in range(logits.shape[-1]):
        sk = s[:, k, None, None]
        factor = torch.cat([torch.cat([sk, 1 - sk], -1), torch.cat([1 - sk, sk], -1)], -2)
        m = x.shape[-1]
        x = (x[:, :, None, :, None] * factor[:, None, :, None, :]).reshape(-1, 2 * m, 2 * m)
    return x


# ----------------------------------------------------------------------------------------------
# Public chart


class ChartVariant(NamedTuple):
    """A chart of `chart_variants.py`: logits per matrix for n; the chart, float64 (B, k) -> (B, n, n)."""

    num_logits: Callable[[int], int]
    chart: Callable[[torch.Tensor, int], torch.Tensor]


CHART_VARIANTS: dict[str, ChartVariant] = {}  # filled by `chart_variants.py` when it is imported
_observers: OrderedDict[int, Callable[[str, torch.Tensor], None]] = OrderedDict()


def register_chart_observer(observer: Callable[[str, torch.Tensor], None]) -> RemovableHandle:
    """Call `observer(method, matrices)` with every result of `birkhoff` (detached) outside
    torch.compile tracing; `handle.remove()` stops it (torch's hook handle)."""
    handle = RemovableHandle(_observers)
    _observers[handle.id] = observer
    return handle


def _check_logits(logits: torch.Tensor, n: int, method: str) -> None:
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must have a floating dtype, got {logits.dtype}")
    expected = num_logits(method, n)
    if logits.ndim == 0 or logits.shape[-1] != expected:
        raise ValueError(
            f"{method} with n={n} expects logits of shape (..., {expected}), got {tuple(logits.shape)}"
        )
    if torch.compiler.is_compiling():  # a value check would break the graph at every chart
        return
    # One float64 reduction (no float32 overflow) is non-finite iff some logit is; confirm exactly.
    total = float(logits.detach().sum(dtype=torch.float64))
    if not math.isfinite(total) and not bool(torch.isfinite(logits).all()):
        raise ValueError("logits contain NaN or infinite values")


def birkhoff(logits: torch.Tensor, n: int, method: str = "rtbp", **options) -> torch.Tensor:
    """Doubly-stochastic chart (docs/ddl_mhc.md, 'Doubly-stochastic charts'):
    logits (..., num_logits(method, n)) -> (..., n, n).

    Options: `iters` (sinkhorn only, default SINKHORN_DEFAULT_ITERS). Autocast is disabled
    inside; float64 logits give a float64 result, any other float dtype a float32 one.
    """
    _check_method_and_n(method, n)
    allowed = {"iters"} if method == "sinkhorn" else set()
    unexpected = sorted(set(options) - allowed)
    if unexpected:
        raise TypeError(
            f"birkhoff(method={method!r}) got unexpected options {unexpected}; valid: {sorted(allowed)}"
        )
    iters = options.get("iters", SINKHORN_DEFAULT_ITERS)
    if method == "sinkhorn" and (isinstance(iters, bool) or not isinstance(iters, int) or iters < 1):
        raise ValueError(f"sinkhorn option iters must be an int >= 1, got {iters!r}")
    triton = kernels("triton_birkhoff", logits) if method in ("tbp", "rtbp") else None
    if triton is not None:  # CUDA tensors in eager mode: the Triton chart, same checks and result
        return triton.triton_birkhoff(logits, n, method)
    _check_logits(logits, n, method)

    batch_shape = logits.shape[:-1]
    out_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    if n == 1 and num_logits(method, 1) == 0:
        # No logits: the 1 x 1 matrix [1], still attached to the graph of `logits` (zero gradient).
        return (logits.to(out_dtype).sum(-1) + 1)[..., None, None]
    with torch.autocast(device_type=logits.device.type, enabled=False):
        flat = logits.reshape(-1, logits.shape[-1]).to(out_dtype)
        if method in CHART_VARIANTS:
            x = _nonnegative(CHART_VARIANTS[method].chart(flat.double(), n))
        elif method == "tbp":
            x = _tbp(flat, n, out_dtype)
        elif method == "rtbp":
            x = rtbp(flat, n, out_dtype)
        elif method == "sinkhorn":
            x = _sinkhorn(flat, n, iters)
        elif method == "mhc_lite":
            x = _mhc_lite(flat.double(), n)
        else:
            x = _kromhc(flat.double(), n)
    x = x.to(out_dtype, memory_format=torch.contiguous_format).view(*batch_shape, n, n)
    if _observers and not torch.compiler.is_compiling():
        for observer in tuple(_observers.values()):
            observer(method, x.detach())
    return x


# ----------------------------------------------------------------------------------------------
# Inverse charts: strictly interior doubly-stochastic matrix -> logits


def _check_interior_ds(matrices: torch.Tensor, name: str) -> None:
    if not isinstance(matrices, torch.Tensor):
        raise TypeError(f"{name} expects a torch.Tensor, got {type(matrices).__name__}")
    if not matrices.is_floating_point():
        raise ValueError(f"{name} expects a floating dtype, got {matrices.dtype}")
    if matrices.ndim < 2 or matrices.shape[-1] != matrices.shape[-2] or matrices.shape[-1] < 1:
        raise ValueError(f"{name} expects square matrices (..., n, n), got shape {tuple(matrices.shape)}")
    if matrices.numel() == 0:
        return
    if not bool((matrices > 0).all()):
        raise ValueError(f"{name} needs a strictly interior doubly-stochastic matrix: all entries > 0")
    tolerance = math.sqrt(torch.finfo(matrices.dtype).eps)
    violation = float(ds_violation(matrices).max())
    if violation > tolerance:
        raise ValueError(
            f"{name} needs a doubly-stochastic matrix: max |row/column sum - 1| = {violation:.3g} "
            f"exceeds {tolerance:.3g}"
        )


# The inverse of a chart's choice of a point in [low, high]: (value, low, high) -> logit.
IntervalLogit = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _logit_in_interval(value: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Inverse of low + (high - low) * sigmoid(t), with the width and the ratio guarded."""
    eps = torch.finfo(value.dtype).eps
    ratio = (value - low) / (high - low).clamp_min(torch.finfo(value.dtype).tiny)
    return torch.logit(ratio.clamp(eps, 1 - eps))


def _suffix_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.flip(dim).cumsum(dim).flip(dim)


def tbp_logits_from_matrix(
    matrices: torch.Tensor, to_logit: IntervalLogit = _logit_in_interval
) -> torch.Tensor:
    """Inverse TBP chart: strictly interior DS matrices (..., n, n) -> logits (..., (n-1)^2) with
    birkhoff(logits, n, "tbp") == matrices. All TBP intervals (docs/ddl_mhc.md, 'Doubly-stochastic charts') at
    once from suffix sums; `to_logit` inverts the interval choice (a variant's own in `chart_variants.py`)."""
    _check_interior_ds(matrices, "tbp_logits_from_matrix")
    n = matrices.shape[-1]
    x = matrices.to(torch.float64)
    row_rest = _suffix_sum(x, -1)  # r_i before (i, j): sum_{j' >= j} X[i, j']
    col_rest = _suffix_sum(x, -2)  # c_j before (i, j): sum_{i' >= i} X[i', j]
    below_right = _suffix_sum(col_rest, -1)[..., :, 1:]  # sum_{j' > j} c_j'
    rows_below = _suffix_sum(x.sum(-1), -1)[..., 1:, None]  # sum_{i' > i} r_i'
    r, c = row_rest[..., :-1, :-1], col_rest[..., :-1, :-1]
    low = torch.clamp(torch.maximum(r - below_right[..., :-1, :], c - rows_below), min=0)
    high = torch.minimum(r, c)
    logits = to_logit(x[..., :-1, :-1], low, high)
    out_dtype = torch.float64 if matrices.dtype == torch.float64 else torch.float32
    return logits.reshape(*matrices.shape[:-2], (n - 1) ** 2).to(out_dtype)


def _split_logits(capacities: torch.Tensor, shares: torch.Tensor, to_logit: IntervalLogit) -> torch.Tensor:
    """Inverse of `_split`: shares (Q, m) of capacities (Q, m) -> logits (Q, m-1)."""
    q, m = shares.shape
    if m == 1:
        return shares.new_zeros(q, 0)
    half = (m + 1) // 2
    total, first = shares.sum(-1), shares[:, :half].sum(-1)
    low = torch.clamp(total - capacities[:, half:].sum(-1), min=0)
    high = torch.minimum(total, capacities[:, :half].sum(-1))
    return torch.cat(
        [
            to_logit(first, low, high)[:, None],
            _split_logits(capacities[:, :half], shares[:, :half], to_logit),
            _split_logits(capacities[:, half:], shares[:, half:], to_logit),
        ],
        -1,
    )


def _rtbp_transport_logits(x: torch.Tensor, to_logit: IntervalLogit) -> torch.Tensor:
    """Inverse of `_rtbp_transport` on P matrices (P, n, n), marginals read off the matrices."""
    p_count, n = x.shape[0], x.shape[-1]
    if n == 1:
        return x.new_zeros(p_count, 0)
    rows, cols = x.sum(-1), x.sum(-2)
    if n % 2 == 1:
        return torch.cat(
            [
                _split_logits(rows, x[:, :, -1], to_logit),
                _split_logits(cols[:, :-1], x[:, -1, :-1], to_logit),
                _rtbp_transport_logits(x[:, :-1, :-1], to_logit),
            ],
            -1,
        )
    h = n // 2
    blocks = x.reshape(p_count, 2, h, 2, h)
    top, bottom, left, right = rows[:, :h], rows[:, h:], cols[:, :h], cols[:, h:]
    top_left = blocks[:, 0, :, 0, :]
    low = torch.clamp(top.sum(-1) - right.sum(-1), min=0)
    high = torch.minimum(top.sum(-1), left.sum(-1))
    block_logit = to_logit(top_left.sum((-1, -2)), low, high)
    rows_tl, rows_bl = top_left.sum(-1), blocks[:, 1, :, 0, :].sum(-1)
    cols_tl, cols_tr = top_left.sum(-2), blocks[:, 0, :, 1, :].sum(-2)
    shares = torch.stack([rows_tl, rows_bl, cols_tl, cols_tr], 1)
    split_logits = _split_logits(
        torch.stack([top, bottom, left, right], 1).reshape(4 * p_count, h),
        shares.reshape(4 * p_count, h),
        to_logit,
    )
    children = blocks.permute(0, 1, 3, 2, 4).reshape(4 * p_count, h, h)
    return torch.cat(
        [
            block_logit[:, None],
            split_logits.reshape(p_count, 4 * (h - 1)),
            _rtbp_transport_logits(children, to_logit).reshape(p_count, 4 * (h - 1) ** 2),
        ],
        -1,
    )


def rtbp_logits_from_matrix(
    matrices: torch.Tensor, to_logit: IntervalLogit = _logit_in_interval
) -> torch.Tensor:
    """Inverse RTBP chart: strictly interior DS matrices (..., n, n) -> logits (..., (n-1)^2) with
    birkhoff(logits, n, "rtbp") == matrices (block masses and splits read off the matrix); `to_logit` as in
    `tbp_logits_from_matrix`."""
    _check_interior_ds(matrices, "rtbp_logits_from_matrix")
    n = matrices.shape[-1]
    x = matrices.to(torch.float64).reshape(-1, n, n)
    out_dtype = torch.float64 if matrices.dtype == torch.float64 else torch.float32
    return _rtbp_transport_logits(x, to_logit).reshape(*matrices.shape[:-2], (n - 1) ** 2).to(out_dtype)

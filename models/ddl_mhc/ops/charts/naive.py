"""Plain PyTorch references of the doubly-stochastic charts (docs/ddl_mhc.md, 'Doubly-stochastic charts';
docs/chart_variants.md): one batched, plain-autograd definition of each, float64 logits (B, k) -> (B, n, n).

- `tbp`, `rtbp`: the transport charts, each entry (TBP) or block mass and split (RTBP) chosen inside its
  feasible interval [L, U] by an interval `choice`: `PLAIN` (L + (U - L) sigmoid(t), the charts "tbp" and
  "rtbp"), `SCALED` ("stbp", "srtbp") or `MARGINED` ("mstbp", "msrtbp"); `INTERVAL_CHOICES` maps the chart
  table's names (`models/ddl_mhc/chart_specs.py`) to them;
- `sinkhorn` (mHC), `mhc_lite`, `kromhc`, and `average` (a softmax mixture of reordered charts: "atbp").

The autograd nodes (`tbp_node.py`, `rtbp_node.py`) and the Triton kernels (`triton.py`), each taking the
same `choice`, are checked against these functions, and these against the plain-Python float64 references
of the tests.
"""

import itertools
import math
from dataclasses import dataclass

import torch

from geoformers.models.ddl_mhc.chart_specs import CHARTS
from geoformers.models.ddl_mhc.ops.constant_cache import constant_cache

# Sinkhorn is approximate: after SINKHORN_DEFAULT_ITERS = 20 iterations the columns sum to 1 and the worst
# |row sum - 1| grows with the logits' scale (median / max over 4,096 float32 matrices, logits N(0, s^2)):
#     s      0.1             1               3               10
#     n=4    7.5e-8/1.6e-7   7.5e-8/1.3e-4   2.4e-4/4.7e-2   2.9e-2/3.7e-1
#     n=8    9.7e-8/2.5e-7   1.0e-7/1.7e-6   3.4e-4/5.5e-2   5.2e-2/4.9e-1
#     n=16   1.9e-7/3.3e-7   1.5e-7/1.6e-6   3.1e-4/4.6e-2   6.7e-2/4.6e-1
SINKHORN_DEFAULT_ITERS = 20
SCALED_BETA = 4.0  # the authors' STBP/SRTBP/MSTBP/MSRTDP2N defaults
SCALED_EPS = 1e-3
MARGIN_RHO = 1e-4  # the authors' MSTBP and MSRTDP2N margin
ATBP_ORDERINGS = CHARTS["atbp"].orderings  # the authors' default: pi = (0, ..., n-1) and (n-1, ..., 0)


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
# Interval choices: (low, high, logit) -> a point of [low, high], and its inverse


@dataclass(frozen=True)
class PlainChoice:
    """x = L + (U - L) sigmoid(t) (docs/ddl_mhc.md, 'Doubly-stochastic charts')."""

    def point(self, low: torch.Tensor, high: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return torch.lerp(low, high, torch.sigmoid(logits))

    def logit(self, value: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
        """Inverse of `point`, with the width and the ratio guarded."""
        eps = torch.finfo(value.dtype).eps
        ratio = (value - low) / (high - low).clamp_min(torch.finfo(value.dtype).tiny)
        return torch.logit(ratio.clamp(eps, 1 - eps))


@dataclass(frozen=True)
class ScaledChoice:
    """x = L + (U - L) (rho + (1 - 2 rho) sigmoid(beta t / (U - L + eps))) in each interval [L, U]
    (docs/chart_variants.md, "Scaled and margined interval choice"); rho = 0 is the scaled choice."""

    beta: float = SCALED_BETA
    eps: float = SCALED_EPS
    rho: float = 0.0

    def __post_init__(self):
        for name, value in (("beta", self.beta), ("eps", self.eps)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
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


PLAIN = PlainChoice()
SCALED = ScaledChoice()
MARGINED = ScaledChoice(rho=MARGIN_RHO)
INTERVAL_CHOICES = {"plain": PLAIN, "scaled": SCALED, "margined": MARGINED}  # `ChartSpec.interval` -> choice


def interval(total: torch.Tensor, cap_first: torch.Tensor, cap_second: torch.Tensor) -> tuple:
    """The feasible mass [L, U] = [max(0, T - C2), min(T, C1)] of the first of two slots of capacities
    C1, C2 sharing T, with U written T - relu(T - C1): at a tie (T = C1) the gradient goes to T, as in the
    nodes' backward (docs/rtbp_backward.md, "Ties")."""
    return torch.relu(total - cap_second), total - torch.relu(total - cap_first)


def _nonnegative(x: torch.Tensor) -> torch.Tensor:
    """x with the remainders that round below zero (about -1e-16) set to 0, gradient unchanged (the
    straight-through identity, as the nodes' clamp): entries of an exact chart are >= 0 exactly."""
    return x + (x.clamp_min(0) - x).detach()


# ----------------------------------------------------------------------------------------------
# TBP: north-west corner, one anti-diagonal at a time
#
# Entry (i, j) reads the remaining row mass r_i, the remaining column mass c_j and D_i = the mass of rows
# below i in columns >= j (D_i = n-1-i before row i's first entry); L = max(0, c_j - D_i) (the TBP
# interval's r_i - sum_{j'>j} c_j', rewritten; its third term c_j - sum_{i'>i} r_i' is <= 0 for unit
# marginals), U = min(r_i, c_j); it passes on r_i - x, c_j - x and D_i - (c_j - x). The entries of one
# anti-diagonal i + j = d are independent, so each diagonal is one batched step.


def anti_diagonals(n: int) -> list[tuple[int, int, int]]:
    """(d, first row, last row) of each anti-diagonal of the (n-1) x (n-1) logit grid."""
    return [(d, max(0, d - (n - 2)), min(d, n - 2)) for d in range(2 * n - 3)]


@constant_cache
def _row_major_from_diagonals(n: int, device: torch.device) -> torch.Tensor:
    """Positions, in anti-diagonal order, of the (n-1)^2 logit cells listed in row-major order."""
    order = [d + i * (n - 2) for d, first, last in anti_diagonals(n) for i in range(first, last + 1)]
    return torch.tensor(order, device=device).argsort()


def _replace(x: torch.Tensor, start: int, values: torch.Tensor) -> torch.Tensor:
    """x with columns start, start + 1, ... replaced by `values` (out of place, for autograd)."""
    return torch.cat([x[:, :start], values, x[:, start + values.shape[1] :]], 1)


def tbp(logits: torch.Tensor, n: int, choice=PLAIN) -> torch.Tensor:
    """TBP with `choice` choosing each entry in its interval: float64 logits (B, (n-1)^2), row-major over
    the north-west (n-1) x (n-1) block, -> (B, n, n); the last column and row take what is left."""
    if n == 1:
        return (logits.sum(-1) + 1)[:, None, None]
    batch = logits.shape[0]
    rows = logits.new_ones(batch, n - 1)
    cols_reversed = logits.new_ones(batch, n - 1)  # c_{n-2}, ..., c_0: a diagonal's columns ascend here
    below = torch.arange(n - 1, 0, -1, dtype=logits.dtype, device=logits.device).expand(batch, -1)
    entries = []
    for d, first, last in anti_diagonals(n):
        count, col_start = last - first + 1, n - 2 - d + first
        r = rows[:, first : last + 1]
        c = cols_reversed[:, col_start : col_start + count]
        cells = logits[:, d + first * (n - 2) : d + last * (n - 2) + 1 : max(n - 2, 1)]
        x = choice.point(torch.relu(c - below[:, first : last + 1]), r - torch.relu(r - c), cells)
        rows = _replace(rows, first, r - x)
        cols_reversed = _replace(cols_reversed, col_start, c - x)
        below = _replace(below, first, below[:, first : last + 1] - (c - x))
        entries.append(x)
    inner = torch.cat(entries, 1)[:, _row_major_from_diagonals(n, logits.device)].view(batch, n - 1, n - 1)
    last_row = torch.cat([cols_reversed.flip(1), 1 - rows.sum(1, keepdim=True)], 1)
    return _nonnegative(torch.cat([torch.cat([inner, rows[:, :, None]], 2), last_row[:, None]], 1))


# ----------------------------------------------------------------------------------------------
# RTBP: recursive TBP (docs/chart_variants.md, "RTBP and the authors' RTBP2N")


def _split(capacities: torch.Tensor, total: torch.Tensor, logits: torch.Tensor, choice) -> torch.Tensor:
    """Split `total` (Q,) over slots 0 <= x <= capacities (Q, m) with logits (Q, m-1): the first ceil(m/2)
    slots get a mass in [max(0, total - cap(second half)), min(total, cap(first half))], then both halves
    recurse (one batched call when m is even). Logits: [this split, first half's, second half's]."""
    q, m = capacities.shape
    if m == 1:
        return total[:, None]
    half = (m + 1) // 2
    first_caps, second_caps = capacities[:, :half], capacities[:, half:]
    first = choice.point(*interval(total, first_caps.sum(1), second_caps.sum(1)), logits[:, 0])
    if m % 2 == 0:
        halves = _split(
            capacities.reshape(2 * q, half),
            torch.stack([first, total - first], 1).view(2 * q),
            logits[:, 1:].reshape(2 * q, half - 1),
            choice,
        )
        return halves.view(q, m)
    return torch.cat(
        [
            _split(first_caps, first, logits[:, 1:half], choice),
            _split(second_caps, total - first, logits[:, half:], choice),
        ],
        1,
    )


def _transport(rows: torch.Tensor, cols: torch.Tensor, logits: torch.Tensor, choice) -> torch.Tensor:
    """RTBP on P square transport problems: marginals (P, n), logits (P, (n-1)^2) -> plans (P, n, n).
    Odd n: the last column, then the rest of the last row, then the (n-1) x (n-1) rest. Even n: the
    top-left block mass, four splits of it over rows and columns, then the four blocks."""
    p_count, n = rows.shape
    if n == 1:
        return rows[:, :, None]
    if n % 2 == 1:
        logits_col, logits_row, logits_inner = logits.split([n - 1, n - 2, (n - 2) ** 2], 1)
        last_col = _split(rows, cols[:, -1], logits_col, choice)
        corner = last_col[:, -1:]
        last_row = _split(cols[:, :-1], rows[:, -1] - corner[:, 0], logits_row, choice)
        inner = _transport(rows[:, :-1] - last_col[:, :-1], cols[:, :-1] - last_row, logits_inner, choice)
        top = torch.cat([inner, last_col[:, :-1, None]], 2)
        return torch.cat([top, torch.cat([last_row, corner], 1)[:, None]], 1)
    h = n // 2
    top, bottom, left, right = rows[:, :h], rows[:, h:], cols[:, :h], cols[:, h:]
    logits_block, logits_splits, logits_children = logits.split([1, 4 * (h - 1), 4 * (h - 1) ** 2], 1)
    top_mass, left_mass = top.sum(1), left.sum(1)
    mass_tl = choice.point(*interval(top_mass, left_mass, right.sum(1)), logits_block[:, 0])
    # Four splits in one batched call: top rows -> TL, bottom rows -> BL, left cols -> TL, right cols -> TR.
    shares = _split(
        torch.stack([top, bottom, left, right], 1).view(4 * p_count, h),
        torch.stack([mass_tl, left_mass - mass_tl, mass_tl, top_mass - mass_tl], 1).view(4 * p_count),
        logits_splits.reshape(4 * p_count, h - 1),
        choice,
    ).view(p_count, 4, h)
    rows_tl, rows_bl, cols_tl, cols_tr = shares.unbind(1)
    children = _transport(
        torch.stack([rows_tl, top - rows_tl, rows_bl, bottom - rows_bl], 1).view(4 * p_count, h),
        torch.stack([cols_tl, cols_tr, left - cols_tl, right - cols_tr], 1).view(4 * p_count, h),
        logits_children.reshape(4 * p_count, (h - 1) ** 2),
        choice,
    )
    return children.view(p_count, 2, 2, h, h).transpose(2, 3).reshape(p_count, n, n)


def rtbp(logits: torch.Tensor, n: int, choice=PLAIN) -> torch.Tensor:
    """RTBP with `choice` choosing every block mass and split: float64 logits (B, (n-1)^2) -> (B, n, n)."""
    if n == 1:
        return (logits.sum(-1) + 1)[:, None, None]
    ones = logits.new_ones(logits.shape[0], n)
    return _nonnegative(_transport(ones, ones, logits, choice))


# ----------------------------------------------------------------------------------------------
# Sinkhorn (mHC), mHC-lite, KromHC, ATBP


def _logsumexp(z: torch.Tensor, dim: int) -> torch.Tensor:
    """log sum exp over `dim`, shifted by the (constant) max so exp cannot overflow."""
    shift = z.detach().amax(dim, keepdim=True)
    return shift + (z - shift).exp().sum(dim, keepdim=True).log()


def sinkhorn(logits: torch.Tensor, n: int, iters: int = SINKHORN_DEFAULT_ITERS) -> torch.Tensor:
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


@constant_cache
def _permutation_matrices(n: int) -> torch.Tensor:
    """All n! permutation matrices, flattened: (n!, n*n), lexicographic order of itertools."""
    perms = torch.tensor(list(itertools.permutations(range(n))), dtype=torch.long)
    eye = torch.eye(n, dtype=torch.float64)
    return eye[perms].reshape(len(perms), n * n)


def mhc_lite(logits: torch.Tensor, n: int) -> torch.Tensor:
    """mHC-lite: softmax weights over the n! permutation matrices (Birkhoff-von Neumann)."""
    perms = _permutation_matrices(n).to(device=logits.device, dtype=logits.dtype)
    return (torch.softmax(logits, -1) @ perms).reshape(-1, n, n)


def kromhc(logits: torch.Tensor, n: int) -> torch.Tensor:
    """KromHC: X = F_1 (x) ... (x) F_k, F = [[s, 1-s], [1-s, s]], s = sigmoid(logit)."""
    s = torch.sigmoid(logits)
    x = logits.new_ones(logits.shape[0], 1, 1)
    for k in range(logits.shape[-1]):
        sk = s[:, k, None, None]
        factor = torch.cat([torch.cat([sk, 1 - sk], -1), torch.cat([1 - sk, sk], -1)], -2)
        m = x.shape[-1]
        x = (x[:, :, None, :, None] * factor[:, None, :, None, :]).reshape(-1, 2 * m, 2 * m)
    return x


@constant_cache
def _inverse_orderings(orderings: tuple[str, ...], n: int, device: torch.device) -> torch.Tensor:
    """pi_k^{-1} for each of the named `orderings`, (K, n): (P^T M P)[pi(i), pi(j)] = M[i, j] reads M at
    (pi^{-1}(a), pi^{-1}(b))."""
    permutations = {"direct": list(range(n)), "reverse": list(range(n - 1, -1, -1))}
    return torch.tensor([permutations[name] for name in orderings], device=device).argsort(1)


def average(
    logits: torch.Tensor, n: int, chart=tbp, orderings: tuple[str, ...] = ATBP_ORDERINGS
) -> torch.Tensor:
    """ATBP (docs/chart_variants.md): H = sum_k softmax(w)_k P_k^T chart(t_k) P_k over the K `orderings`,
    float64 logits (B, K + K (n-1)^2) laid out [w, t_1, ..., t_K] -> (B, n, n). The K charts are one call of
    `chart` (float64 (B K, (n-1)^2) -> (B K, n, n); the chart table passes the node with its choice)."""
    k = len(orderings)
    weights = torch.softmax(logits[:, :k], -1)
    if n == 1:
        return weights.sum(-1)[:, None, None]
    batch = logits.shape[0]
    charts = chart(logits[:, k:].reshape(batch * k, (n - 1) ** 2), n).view(batch, k, n, n)
    inverse = _inverse_orderings(orderings, n, logits.device)
    conjugated = [charts[:, i].index_select(1, pi).index_select(2, pi) for i, pi in enumerate(inverse)]
    return (weights[:, :, None, None] * torch.stack(conjugated, 1)).sum(1)

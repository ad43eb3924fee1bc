"""Inverse charts (docs/ddl_mhc.md, 'Doubly-stochastic charts'): a strictly interior doubly-stochastic matrix
-> the logits that `naive.tbp` / `naive.rtbp` (with the plain or a variant's interval choice) map to it,
which shows that the charts reach every interior point. ATBP (a mixture) has no inverse.
"""

import math
from collections.abc import Callable

import torch

from geoformers.models.ddl_mhc.chart_specs import CHARTS
from geoformers.models.ddl_mhc.ops.charts.naive import INTERVAL_CHOICES, PLAIN, ds_violation

# The interval variants (one ordering, a non-plain choice): the charts with an inverse of their own choice.
_INTERVAL_VARIANTS = tuple(
    name for name, spec in CHARTS.items() if spec.interval != "plain" and len(spec.orderings) == 1
)


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


def _suffix_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.flip(dim).cumsum(dim).flip(dim)


def tbp_logits_from_matrix(matrices: torch.Tensor, to_logit: IntervalLogit = PLAIN.logit) -> torch.Tensor:
    """Inverse TBP chart: strictly interior DS matrices (..., n, n) -> logits (..., (n-1)^2) with
    birkhoff(logits, n, "tbp") == matrices. All TBP intervals (docs/ddl_mhc.md, 'Doubly-stochastic charts')
    at once from suffix sums; `to_logit` inverts the interval choice (a variant's own:
    `variant_logits_from_matrix`)."""
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
    """Inverse of `naive._split`: shares (Q, m) of capacities (Q, m) -> logits (Q, m-1)."""
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
    """Inverse of `naive._transport` on P matrices (P, n, n), marginals read off the matrices."""
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


def rtbp_logits_from_matrix(matrices: torch.Tensor, to_logit: IntervalLogit = PLAIN.logit) -> torch.Tensor:
    """Inverse RTBP chart: strictly interior DS matrices (..., n, n) -> logits (..., (n-1)^2) with
    birkhoff(logits, n, "rtbp") == matrices (block masses and splits read off the matrix); `to_logit` as in
    `tbp_logits_from_matrix`."""
    _check_interior_ds(matrices, "rtbp_logits_from_matrix")
    n = matrices.shape[-1]
    x = matrices.to(torch.float64).reshape(-1, n, n)
    out_dtype = torch.float64 if matrices.dtype == torch.float64 else torch.float32
    return _rtbp_transport_logits(x, to_logit).reshape(*matrices.shape[:-2], (n - 1) ** 2).to(out_dtype)


def variant_logits_from_matrix(matrices: torch.Tensor, method: str) -> torch.Tensor:
    """Inverse of an interval variant: strictly interior DS matrices (..., n, n) -> logits (..., (n-1)^2)
    with birkhoff(logits, n, method) == matrices (the inverse TBP/RTBP with the variant's choice inverted).
    The margined variants reach only matrices whose every entry keeps the margin (ValueError otherwise)."""
    if method not in _INTERVAL_VARIANTS:
        raise ValueError(
            f"`method` must be one of {list(_INTERVAL_VARIANTS)} (atbp, a mixture of charts, has no "
            f"inverse), got {method!r}"
        )
    _check_interior_ds(matrices, f"variant_logits_from_matrix(method={method!r})")
    spec = CHARTS[method]
    inverse = tbp_logits_from_matrix if spec.base == "tbp" else rtbp_logits_from_matrix
    return inverse(matrices, INTERVAL_CHOICES[spec.interval].logit)

"""Plain-Python float64 references for the TBP and RTBP charts (docs/ddl_mhc.md, 'Doubly-stochastic charts').

One matrix at a time, explicit loops, written straight from the definitions, so that the batched PyTorch
references of `models/ddl_mhc/ops/charts/naive.py` are checked against code that shares nothing with them.
Inputs are sequences of floats, outputs lists of rows.
"""

import math
from collections.abc import Sequence


def _sigmoid(t: float) -> float:
    """Overflow-free logistic function."""
    if t >= 0:
        return 1.0 / (1.0 + math.exp(-t))
    e = math.exp(t)
    return e / (1.0 + e)


def _point_in_interval(low: float, high: float, t: float) -> float:
    """low + (high - low) * sigmoid(t): the chart's map from one logit into [low, high]."""
    return low + (high - low) * _sigmoid(t)


def tbp_reference(logits: Sequence[float], n: int) -> list[list[float]]:
    """TBP, north-west corner (docs/ddl_mhc.md, 'Doubly-stochastic charts'): X[i, j], i, j < n-1, filled in
    row-major order inside L = max(0, r_i - sum_{j'>j} c_j', c_j - sum_{i'>i} r_i'), U = min(r_i, c_j); the
    last column and the last row take what is left."""
    logits = [float(t) for t in logits]
    if len(logits) != (n - 1) ** 2:
        raise ValueError(f"tbp_reference needs (n-1)^2 = {(n - 1) ** 2} logits for n={n}, got {len(logits)}")
    row_mass = [1.0] * n
    col_mass = [1.0] * n
    x = [[0.0] * n for _ in range(n)]
    k = 0
    for i in range(n - 1):
        for j in range(n - 1):
            low = max(0.0, row_mass[i] - sum(col_mass[j + 1 :]), col_mass[j] - sum(row_mass[i + 1 :]))
            high = min(row_mass[i], col_mass[j])
            x[i][j] = _point_in_interval(low, high, logits[k])
            k += 1
            row_mass[i] -= x[i][j]
            col_mass[j] -= x[i][j]
        x[i][n - 1] = row_mass[i]
        col_mass[n - 1] -= row_mass[i]
        row_mass[i] = 0.0
    for j in range(n):
        x[n - 1][j] = col_mass[j]
    return x


def split_reference(capacities: Sequence[float], total: float, logits: Sequence[float]) -> list[float]:
    """Split `total` over slots with 0 <= x_k <= capacities[k], sum x = total (an m x 2 transport
    problem, m-1 logits): the first ceil(m/2) slots get a mass in its feasible interval
    [max(0, total - cap(second half)), min(total, cap(first half))], then both halves recurse.
    Logit layout: [this split, first half's logits, second half's logits]."""
    m = len(capacities)
    if m == 1:
        return [total]
    half = (m + 1) // 2
    low = max(0.0, total - sum(capacities[half:]))
    high = min(total, sum(capacities[:half]))
    first = _point_in_interval(low, high, logits[0])
    return split_reference(capacities[:half], first, logits[1:half]) + split_reference(
        capacities[half:], total - first, logits[half:]
    )


def _rtbp_transport(rows: list[float], cols: list[float], logits: list[float]) -> list[list[float]]:
    """RTBP on a square transport problem with marginals rows, cols (equal totals)."""
    n = len(rows)
    if n == 1:
        return [[rows[0]]]
    if n % 2 == 1:
        last_col = split_reference(rows, cols[-1], logits[: n - 1])
        last_row = split_reference(cols[:-1], rows[-1] - last_col[-1], logits[n - 1 : 2 * n - 3])
        inner = _rtbp_transport(
            [r - x for r, x in zip(rows[:-1], last_col[:-1], strict=True)],
            [c - y for c, y in zip(cols[:-1], last_row, strict=True)],
            logits[2 * n - 3 :],
        )
        return [inner_row + [last_col[i]] for i, inner_row in enumerate(inner)] + [last_row + [last_col[-1]]]
    h = n // 2
    top, bottom, left, right = rows[:h], rows[h:], cols[:h], cols[h:]
    low = max(0.0, sum(top) - sum(right))
    high = min(sum(top), sum(left))
    mass_tl = _point_in_interval(low, high, logits[0])
    mass_tr = sum(top) - mass_tl
    mass_bl = sum(left) - mass_tl
    p = h - 1
    rows_tl = split_reference(top, mass_tl, logits[1 : 1 + p])
    rows_bl = split_reference(bottom, mass_bl, logits[1 + p : 1 + 2 * p])
    cols_tl = split_reference(left, mass_tl, logits[1 + 2 * p : 1 + 3 * p])
    cols_tr = split_reference(right, mass_tr, logits[1 + 3 * p : 1 + 4 * p])
    child = p * p
    offset = 1 + 4 * p
    tl = _rtbp_transport(rows_tl, cols_tl, logits[offset : offset + child])
    tr = _rtbp_transport(
        [a - b for a, b in zip(top, rows_tl, strict=True)],
        cols_tr,
        logits[offset + child : offset + 2 * child],
    )
    bl = _rtbp_transport(
        rows_bl,
        [a - b for a, b in zip(left, cols_tl, strict=True)],
        logits[offset + 2 * child : offset + 3 * child],
    )
    br = _rtbp_transport(
        [a - b for a, b in zip(bottom, rows_bl, strict=True)],
        [a - b for a, b in zip(right, cols_tr, strict=True)],
        logits[offset + 3 * child : offset + 4 * child],
    )
    return [a + b for a, b in zip(tl, tr, strict=True)] + [a + b for a, b in zip(bl, br, strict=True)]


def rtbp_reference(logits: Sequence[float], n: int) -> list[list[float]]:
    """RTBP (docs/ddl_mhc.md, 'Doubly-stochastic charts'), one matrix. Even n: the top-left block mass in
    [max(0, R_top - C_right), min(R_top, C_left)], then four splits of block masses over rows/columns
    (top rows into TL/TR, bottom rows into BL/BR, left columns into TL/BL, right columns into TR/BR),
    then the four child transport problems TL, TR, BL, BR. Odd n: peel the last column (split of the
    rows, n-1 logits), then the last row (split of the other columns, n-2 logits), then recurse.
    Logits are consumed in exactly that order; (n-1)^2 in all."""
    logits = [float(t) for t in logits]
    if len(logits) != (n - 1) ** 2:
        raise ValueError(f"rtbp_reference needs (n-1)^2 = {(n - 1) ** 2} logits for n={n}, got {len(logits)}")
    return _rtbp_transport([1.0] * n, [1.0] * n, logits)

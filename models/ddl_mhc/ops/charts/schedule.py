"""The TBP and RTBP charts as one fixed schedule of affine forms (docs/rtbp_backward.md), shared by the RTBP
autograd node (`rtbp_node.py`) and the Triton kernels (`triton.py`).

Every quantity the recursions of `naive.tbp` / `naive.rtbp` read is affine in the earlier interval points
x_1, ..., x_K (K = (n-1)^2, one per logit t_k):

    x_k = lerp(L, U, sigmoid(t_k)),   L = relu(a2),   U = T - relu(a1),

with the total T, a1 = T - C1 and a2 = T - C2 (capacities C1, C2) affine forms over the slots
v = [1, x_1, ..., x_K], and every matrix entry affine in v too. `_Recorder` replays the two recursions on
sparse forms (slot -> coefficient); `chart_schedule` puts each point at the first level after the points it
reads (RTBP n = 4: 3 levels, n = 16: 7; TBP: its 2n-3 anti-diagonals) and renumbers the slots level by
level, so that level l writes the contiguous slots [start, stop). The RTBP node evaluates a level as
one batched step; the Triton kernels walk the slots in that (topological) order, one point at a time.
"""

from typing import NamedTuple

import torch

from geoformers.models.ddl_mhc.ops.constant_cache import constant_cache

Form = dict[int, float]  # slot -> coefficient; slot 0 is the constant 1
Terms = tuple[tuple[int, float], ...]  # a form as sorted (slot, coefficient) pairs


def _combine(a: Form, b: Form, sign: float = 1.0) -> Form:
    """a + sign * b, dropping the coefficients that cancel to exactly 0 (so a form that cancels
    structurally, e.g. RTBP's top block T - C2 = n/2 - n/2, evaluates to exactly 0)."""
    out = dict(a)
    for slot, coefficient in b.items():
        out[slot] = out.get(slot, 0.0) + sign * coefficient
        if out[slot] == 0.0:
            del out[slot]
    return out


def _minus(a: list[Form], b: list[Form]) -> list[Form]:
    return [_combine(x, y, -1) for x, y in zip(a, b, strict=True)]


def _total(forms: list[Form]) -> Form:
    out: Form = {}
    for form in forms:
        out = _combine(out, form)
    return out


class _Recorder:
    """The interval points of one chart in the recursion's order: (logit, T, a1, a2) per point."""

    def __init__(self):
        self.points: list[tuple[int, Form, Form, Form]] = []

    def point(self, total: Form, over_first: Form, over_second: Form, logit: int) -> Form:
        """New slot x = lerp(relu(over_second), total - relu(over_first), sigmoid(t_logit))."""
        self.points.append((logit, total, over_first, over_second))
        return {len(self.points): 1.0}

    def tbp(self, n: int) -> list[list[Form]]:
        """`naive.tbp` in row-major order: entry (i, j) with T = r, a1 = r - c, a2 = c - D."""
        cols = [{0: 1.0} for _ in range(n - 1)]
        matrix, row_rests = [], []
        for i in range(n - 1):
            rest, below = {0: 1.0}, {0: n - 1.0 - i}
            row = []
            for j in range(n - 1):
                x = self.point(
                    rest, _combine(rest, cols[j], -1), _combine(cols[j], below, -1), i * (n - 1) + j
                )
                rest, cols[j] = _combine(rest, x, -1), _combine(cols[j], x, -1)
                below = _combine(below, cols[j], -1)
                row.append(x)
            matrix.append([*row, rest])
            row_rests.append(rest)
        matrix.append([*cols, _combine({0: 1.0}, _total(row_rests), -1)])
        return matrix

    def split(self, caps: list[Form], total: Form, logits: list[int]) -> list[Form]:
        """`naive._split`: the first ceil(m/2) slots get a mass in [max(0, total - cap_2),
        min(total, cap_1)], then both halves recurse."""
        if len(caps) == 1:
            return [total]
        half = (len(caps) + 1) // 2
        over_first, over_second = (_combine(total, _total(part), -1) for part in (caps[:half], caps[half:]))
        first = self.point(total, over_first, over_second, logits[0])
        rest = logits[1:]
        return self.split(caps[:half], first, rest[: half - 1]) + self.split(
            caps[half:], _combine(total, first, -1), rest[half - 1 :]
        )

    def transport(self, rows: list[Form], cols: list[Form], logits: list[int]) -> list[list[Form]]:
        """`naive._transport` on one transport problem, with its logit order."""
        n = len(rows)
        if n == 1:
            return [[rows[0]]]
        if n % 2 == 1:
            last_col = self.split(rows, cols[-1], logits[: n - 1])
            corner = last_col[-1]
            last_row = self.split(cols[:-1], _combine(rows[-1], corner, -1), logits[n - 1 : 2 * n - 3])
            inner = self.transport(
                _minus(rows[:-1], last_col[:-1]), _minus(cols[:-1], last_row), logits[2 * n - 3 :]
            )
            return [[*row, x] for row, x in zip(inner, last_col[:-1], strict=True)] + [[*last_row, corner]]
        h = n // 2
        top, bottom, left, right = rows[:h], rows[h:], cols[:h], cols[h:]
        top_mass, left_mass = _total(top), _total(left)
        over_first, over_second = _combine(top_mass, left_mass, -1), _combine(top_mass, _total(right), -1)
        mass_tl = self.point(top_mass, over_first, over_second, logits[0])
        splits = [logits[1 + k * (h - 1) : 1 + (k + 1) * (h - 1)] for k in range(4)]
        rows_tl = self.split(top, mass_tl, splits[0])
        rows_bl = self.split(bottom, _combine(left_mass, mass_tl, -1), splits[1])
        cols_tl = self.split(left, mass_tl, splits[2])
        cols_tr = self.split(right, _combine(top_mass, mass_tl, -1), splits[3])
        child_rows = [rows_tl, _minus(top, rows_tl), rows_bl, _minus(bottom, rows_bl)]
        child_cols = [cols_tl, cols_tr, _minus(left, cols_tl), _minus(right, cols_tr)]
        start, size = 1 + 4 * (h - 1), (h - 1) ** 2
        children = [
            self.transport(child_rows[k], child_cols[k], logits[start + k * size : start + (k + 1) * size])
            for k in range(4)
        ]
        return [[children[2 * (i // h) + j // h][i % h][j % h] for j in range(n)] for i in range(n)]


class Schedule(NamedTuple):
    """A chart as Python constants, slots renumbered level by level (slot k + 1 holds point k):

    slot_logit: the logit of each point; levels: (start, stop) slot ranges; points: (T, a1, a2) of each
    point, reading only slots of earlier levels; entries: the n*n matrix entries, row-major."""

    slot_logit: tuple[int, ...]
    levels: tuple[tuple[int, int], ...]
    points: tuple[tuple[Terms, Terms, Terms], ...]
    entries: tuple[Terms, ...]


@constant_cache
@torch.compiler.assume_constant_result  # plain Python: torch.compile / export take the result as given
def chart_schedule(method: str, n: int) -> Schedule:
    """The schedule of chart `method` ("tbp" or "rtbp") at n >= 2."""
    recorder = _Recorder()
    if method == "tbp":
        matrix = recorder.tbp(n)
    else:
        ones = [{0: 1.0} for _ in range(n)]
        matrix = recorder.transport(ones, ones, list(range((n - 1) ** 2)))
    level = {0: 0}
    for k, (_, *forms) in enumerate(recorder.points, start=1):
        level[k] = 1 + max((level[slot] for form in forms for slot in form), default=0)
    order = sorted(range(1, len(recorder.points) + 1), key=lambda k: (level[k], k))
    renumber = {0: 0} | {old: new for new, old in enumerate(order, start=1)}

    def terms(form: Form) -> Terms:
        return tuple(sorted((renumber[slot], value) for slot, value in form.items()))

    levels, start = [], 1
    for depth in range(1, max(level.values()) + 1):
        size = sum(1 for k in order if level[k] == depth)
        levels.append((start, start + size))
        start += size
    return Schedule(
        slot_logit=tuple(recorder.points[k - 1][0] for k in order),
        levels=tuple(levels),
        points=tuple(tuple(terms(form) for form in recorder.points[k - 1][1:]) for k in order),
        entries=tuple(terms(form) for row in matrix for form in row),
    )

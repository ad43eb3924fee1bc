"""RTBP chart as one autograd node: a fixed, level-scheduled plan with a hand-written backward.

`birkhoff._rtbp_autograd` (the plain reference) recurses over 2x2 blocks and splits. Every quantity it
reads is affine in the earlier interval points x_1, ..., x_K (K = (n-1)^2, one per logit t_k):

    x_k = lerp(L, U, s_k),   L = relu(a2),   U = T - relu(a1),   s_k = sigmoid(t_k),

with T the total, a1 = T - C1 and a2 = T - C2 (capacities C1, C2 of the two halves) affine forms over the
slots v = [1, x_1, ..., x_K], and every matrix entry affine in v too (docs/rtbp_backward.md). `_schedule`
records that recursion once per n as sparse forms and puts each point at the first level after the points
it reads (n = 4: 3 levels, n = 16: 7); `_plan` holds each level's forms as one table, a dense matrix or
a list of (form, slot, coefficient) terms. The forward is then a fixed sequence of batched ops per level
(the table product, two ramps, a subtraction, a lerp, a store); the backward sweeps the levels in reverse
with the transposed tables (docs/rtbp_backward.md, "Backward"). Without a gradient the node is skipped and
only the forward runs (decoding).

Arithmetic is float64 with the slots batch-last, (K+1, B); the finished matrix is clamped at 0 (float64
remainders of about -1e-16; straight through in the backward, like TBP) and rounded once. Ties follow the
reference: relu'(0) = 0, so U = T at T = C1 and L = 0 at T = C2. A form that cancels exactly (e.g. the
top block's T - C2 = n/2 - n/2) has no terms and evaluates to exactly 0; a tie decided by a rounding
residue may fall on the other side than in the reference (docs/rtbp_backward.md, "Ties").
"""

from functools import cache

import torch
from torch.autograd.function import once_differentiable

Form = dict[int, float]  # slot -> coefficient; slot 0 is the constant 1


def _combine(a: Form, b: Form, sign: float = 1.0) -> Form:
    """a + sign * b, dropping the coefficients that cancel to exactly 0."""
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
    """The interval points of one chart in the reference's order: (logit, T, a1, a2) per point."""

    def __init__(self):
        self.points: list[tuple[int, Form, Form, Form]] = []

    def point(self, total: Form, cap_first: Form, cap_second: Form, logit: int) -> Form:
        """x = lerp(relu(total - cap_second), total - relu(total - cap_first), sigmoid(t_logit))."""
        self.points.append((logit, total, _combine(total, cap_first, -1), _combine(total, cap_second, -1)))
        return {len(self.points): 1.0}

    def split(self, caps: list[Form], total: Form, logits: list[int]) -> list[Form]:
        """`birkhoff._split`: the first ceil(m/2) slots get a mass in [max(0, total - cap_2),
        min(total, cap_1)], then both halves recurse."""
        if len(caps) == 1:
            return [total]
        half = (len(caps) + 1) // 2
        first = self.point(total, _total(caps[:half]), _total(caps[half:]), logits[0])
        rest = logits[1:]
        return self.split(caps[:half], first, rest[: half - 1]) + self.split(
            caps[half:], _combine(total, first, -1), rest[half - 1 :]
        )

    def transport(self, rows: list[Form], cols: list[Form], logits: list[int]) -> list[list[Form]]:
        """`birkhoff._rtbp_transport` on one transport problem, with its logit order."""
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
        mass_tl = self.point(top_mass, left_mass, _total(right), logits[0])
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


def _terms(forms: list[Form], renumber: dict[int, int]) -> tuple[tuple, tuple, tuple]:
    """Forms -> their terms as (form index, slot, coefficient) columns."""
    terms = [
        (f, renumber[slot], value) for f, form in enumerate(forms) for slot, value in sorted(form.items())
    ]
    return tuple(zip(*terms, strict=True)) if terms else ((), (), ())


@cache
@torch.compiler.assume_constant_result  # plain Python: torch.compile / export take the result as given
def _schedule(n: int) -> tuple:
    """The RTBP plan as Python constants: (logit of each slot, levels, entry terms).

    Slots are renumbered level by level, so level l writes the contiguous slots [start, stop); its terms
    give the forms T, a1, a2 of its points stacked (3m forms); the entry terms give the n*n entries."""
    recorder = _Recorder()
    ones = [{0: 1.0} for _ in range(n)]
    matrix = recorder.transport(ones, ones, list(range((n - 1) ** 2)))
    level = {0: 0}
    for k, (_, *forms) in enumerate(recorder.points, start=1):
        level[k] = 1 + max((level[slot] for form in forms for slot in form), default=0)
    order = sorted(range(1, len(recorder.points) + 1), key=lambda k: (level[k], k))
    renumber = {0: 0} | {old: new for new, old in enumerate(order, start=1)}
    levels, start = [], 1
    for depth in range(1, max(level.values()) + 1):
        members = [k for k in order if level[k] == depth]
        forms = [recorder.points[k - 1][1 + part] for part in range(3) for k in members]
        levels.append((start, start + len(members), _terms(forms, renumber)))
        start += len(members)
    slot_logit = tuple(recorder.points[k - 1][0] for k in order)
    return slot_logit, tuple(levels), _terms([form for row in matrix for form in row], renumber)


# A table is evaluated as one dense (F, S) GEMM when at least 1/_DENSE_FILL of its entries are terms
# (every table at n <= 8), else term by term (gather, scale, index_add): the GEMM is one op and streams
# no (terms, B) temporary, the term lists keep the work O(terms) at large n.
_DENSE_FILL = 16


def _table(terms: tuple, count: int, width: int, device: torch.device) -> tuple:
    """`count` forms over the first `width` slots as (dense (count, width) float64 or None, form (T,),
    slot (T,), coefficient (T, 1) float64)."""
    rows, slots, values = terms
    if len(values) * _DENSE_FILL >= count * width:
        dense = torch.zeros(count, width, dtype=torch.float64)
        dense[list(rows), list(slots)] = torch.tensor(values, dtype=torch.float64)
        return dense.to(device), None, None, None
    return (
        None,
        torch.tensor(rows, dtype=torch.long, device=device),
        torch.tensor(slots, dtype=torch.long, device=device),
        torch.tensor(values, dtype=torch.float64, device=device).view(-1, 1),
    )


@cache
def _plan(n: int, device: torch.device) -> tuple:
    """`_schedule(n)` as tensors: (logit of each slot (K,), slot of each logit (K,), levels as
    (start, stop, table), entry table); level l's table reads the slots before `start`."""
    slot_logit, levels, entries = _schedule(n)
    logit_slot = sorted(range(len(slot_logit)), key=slot_logit.__getitem__)
    return (
        torch.tensor(slot_logit, dtype=torch.long, device=device),
        torch.tensor(logit_slot, dtype=torch.long, device=device),
        tuple(
            (start, stop, _table(terms, 3 * (stop - start), start, device)) for start, stop, terms in levels
        ),
        _table(entries, n * n, len(slot_logit) + 1, device),
    )


def _evaluate(values: torch.Tensor, table: tuple, count: int) -> torch.Tensor:
    """The `count` forms of a table at the slots `values` (S, B) -> (count, B)."""
    dense, rows, slots, coefficient = table
    if dense is not None:
        return torch.mm(dense, values if dense.shape[1] == values.shape[0] else values[: dense.shape[1]])
    terms = values.index_select(0, slots).mul_(coefficient)
    return values.new_zeros(count, values.shape[1]).index_add_(0, rows, terms)


def _scatter(grad_values: torch.Tensor, table: tuple, grad_forms: torch.Tensor) -> None:
    """Backward of `_evaluate`: grad_values += table^T grad_forms."""
    dense, rows, slots, coefficient = table
    if dense is not None:
        grad_values[: dense.shape[1]].addmm_(dense.t(), grad_forms)
    else:
        grad_values.index_add_(0, slots, grad_forms.index_select(0, rows).mul_(coefficient))


def _forward(logits: torch.Tensor, n: int, out_dtype: torch.dtype, keep_for_backward: bool) -> tuple:
    """The chart (B, n, n) in out_dtype and, with keep_for_backward, the tape (s, U - L, [a1 > 0, a2 > 0])."""
    slot_logit, _, levels, entries = _plan(n, logits.device)
    batch = logits.shape[0]
    # (K, B) in slot order, gathered along the contiguous logit dimension
    s = torch.sigmoid(logits.to(torch.float64)).index_select(1, slot_logit).t().contiguous()
    values = s.new_empty(s.shape[0] + 1, batch)
    values[0] = 1
    if keep_for_backward:
        width, positive = torch.empty_like(s), s.new_empty(2, *s.shape, dtype=torch.bool)
    s_levels = s.split([stop - start for start, stop, _ in levels])
    for (start, stop, table), s_level in zip(levels, s_levels, strict=True):
        m = stop - start
        forms = _evaluate(values, table, 3 * m)
        total, ramp_forms = forms.split([m, 2 * m])
        over_first, low = ramp_forms.relu().chunk(2)
        high = total - over_first
        values[start:stop] = torch.lerp(low, high, s_level)
        if keep_for_backward:
            width[start - 1 : stop - 1] = high - low
            positive[:, start - 1 : stop - 1] = ramp_forms.view(2, m, batch) > 0
    matrix = _evaluate(values, entries, n * n).clamp_min_(0)  # remainders of -1e-16 -> 0
    return matrix.t().to(out_dtype).reshape(batch, n, n), (s, width, positive) if keep_for_backward else None


class RTBPFunction(torch.autograd.Function):
    """RTBP chart (docs/rtbp_backward.md): logits (B, (n-1)^2) -> (B, n, n) in `out_dtype`.

    Saved for the backward: s and U - L (float64) and the ramp masks [a1 > 0], [a2 > 0] per point; then
    dx/dT = s, dx/da1 = -s [a1 > 0], dx/da2 = (1 - s) [a2 > 0], dx/dt = (U - L) s (1 - s). Double backward
    is not supported (`once_differentiable` raises)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, n: int, out_dtype: torch.dtype):
        x, tape = _forward(logits, n, out_dtype, True)
        ctx.save_for_backward(*tape)
        ctx.n, ctx.in_dtype = n, logits.dtype
        return x

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: torch.Tensor) -> tuple:
        s, width, positive = ctx.saved_tensors
        _, logit_slot, levels, entries = _plan(ctx.n, s.device)
        batch = grad_output.shape[0]
        grad_values = s.new_zeros(s.shape[0] + 1, batch)
        _scatter(grad_values, entries, grad_output.reshape(batch, ctx.n * ctx.n).t().to(torch.float64))
        for start, stop, table in reversed(levels):
            grad_x, s_level = grad_values[start:stop], s[start - 1 : stop - 1]
            grad_total = grad_x * s_level
            grad_low = grad_x - grad_total  # dx/dL = 1 - s
            grad_forms = torch.cat(
                [
                    grad_total,
                    -grad_total * positive[0, start - 1 : stop - 1],
                    grad_low * positive[1, start - 1 : stop - 1],
                ]
            )
            _scatter(grad_values, table, grad_forms)
        grad_logits = (grad_values[1:] * width).mul_(s).mul_(1 - s).index_select(0, logit_slot).t()
        return grad_logits.to(ctx.in_dtype), None, None


def rtbp(logits: torch.Tensor, n: int, out_dtype: torch.dtype) -> torch.Tensor:
    """RTBP on logits (B, (n-1)^2) -> (B, n, n) in out_dtype: one autograd node when a gradient is needed,
    else the forward alone (decoding: no tape, no node)."""
    if torch.is_grad_enabled() and logits.requires_grad:
        return RTBPFunction.apply(logits, n, out_dtype)
    return _forward(logits, n, out_dtype, False)[0]

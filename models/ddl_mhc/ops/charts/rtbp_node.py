"""RTBP as one autograd node for every interval choice ("rtbp", "srtbp", "msrtbp"): the level-scheduled plan
of `schedule.chart_schedule` with a hand-written backward (docs/rtbp_backward.md); its reference is
`naive.rtbp` with the same choice.

`_plan` holds each level's forms (T, a1, a2 of its points) as one table, a dense matrix or a list of
(form, slot, coefficient) terms. The forward is then a fixed sequence of batched ops per level (the table
product, two ramps, a subtraction, the choice's fraction, a lerp, a store); the backward sweeps the levels
in reverse with the transposed tables (docs/rtbp_backward.md, "Backward"). Without a gradient the node is
skipped and only the forward runs (decoding).

Arithmetic is float64 with the slots batch-last, (K+1, B); the finished matrix is clamped at 0 (float64
remainders of about -1e-16; straight through in the backward, like TBP) and rounded once. Ties follow the
reference: relu'(0) = 0, so U = T at T = C1 and L = 0 at T = C2. A form that cancels exactly (e.g. the
top block's T - C2 = n/2 - n/2) has no terms and evaluates to exactly 0; a tie decided by a rounding
residue may fall on the other side than in the reference (docs/rtbp_backward.md, "Ties").
"""

import torch
from torch.autograd.function import once_differentiable

from geoformers.models.ddl_mhc.ops.charts.naive import PLAIN, ScaledChoice
from geoformers.models.ddl_mhc.ops.charts.schedule import Terms, chart_schedule
from geoformers.models.ddl_mhc.ops.constant_cache import constant_cache


def _terms(forms: list[Terms]) -> tuple[tuple, tuple, tuple]:
    """Forms -> their terms as (form index, slot, coefficient) columns."""
    terms = [(f, slot, value) for f, form in enumerate(forms) for slot, value in form]
    return tuple(zip(*terms, strict=True)) if terms else ((), (), ())


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


@constant_cache
def _plan(base: str, n: int, device: torch.device) -> tuple:
    """`chart_schedule(base, n)` as tensors: (logit of each slot (K,), slot of each logit (K,), levels as
    (start, stop, table), entry table); level l's table stacks the forms T, a1, a2 of its points (3m forms)
    over the slots before `start`."""
    schedule = chart_schedule(base, n)
    slot_logit = schedule.slot_logit
    logit_slot = sorted(range(len(slot_logit)), key=slot_logit.__getitem__)
    levels = []
    for start, stop in schedule.levels:
        forms = [schedule.points[k - 1][part] for part in range(3) for k in range(start, stop)]
        levels.append((start, stop, _table(_terms(forms), 3 * (stop - start), start, device)))
    return (
        torch.tensor(slot_logit, dtype=torch.long, device=device),
        torch.tensor(logit_slot, dtype=torch.long, device=device),
        tuple(levels),
        _table(_terms(list(schedule.entries)), n * n, len(slot_logit) + 1, device),
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


def _forward(logits: torch.Tensor, n: int, base: str, choice, out_dtype: torch.dtype, keep: bool) -> tuple:
    """The chart (B, n, n) in out_dtype and, with `keep`, the tape (dx/dU, dx/dt, [a1 > 0, a2 > 0])."""
    slot_logit, _, levels, entries = _plan(base, n, logits.device)
    batch = logits.shape[0]
    scaled = isinstance(choice, ScaledChoice)
    # (K, B) in slot order, gathered along the contiguous logit dimension
    t = logits.to(torch.float64)
    t = (t if scaled else torch.sigmoid(t)).index_select(1, slot_logit).t().contiguous()
    values = t.new_empty(t.shape[0] + 1, batch)
    values[0] = 1
    if keep:
        slope, positive = torch.empty_like(t), t.new_empty(2, *t.shape, dtype=torch.bool)
        sigmoids = torch.empty_like(t) if scaled else None  # the scaled choice's sigmoids
    t_levels = t.split([stop - start for start, stop, _ in levels])
    for (start, stop, table), t_level in zip(levels, t_levels, strict=True):
        m = stop - start
        forms = _evaluate(values, table, 3 * m)
        total, ramp_forms = forms.split([m, 2 * m])
        over_first, low = ramp_forms.relu().chunk(2)
        high = total - over_first
        points = slice(start - 1, stop - 1)
        width = high - low if scaled or keep else None
        if scaled:  # `ScaledChoice.point`
            argument = torch.mul(t_level, choice.beta).div_(width.clamp(min=0).add_(choice.eps))
            fraction = torch.sigmoid(argument)
            if keep:
                sigmoids[points] = fraction
            if choice.rho:
                fraction = fraction * (1 - 2 * choice.rho) + choice.rho
        else:
            fraction = t_level
        values[start:stop] = torch.lerp(low, high, fraction)
        if keep:  # (plain assignments, no `out=` into views: torch.compile traces these)
            slope[points] = width
            positive[:, points] = ramp_forms.view(2, m, batch) > 0
    matrix = _evaluate(values, entries, n * n).clamp_min_(0)  # remainders of -1e-16 -> 0
    if not keep:
        return matrix.t().to(out_dtype).reshape(batch, n, n), None
    if scaled:
        # x = L + W f, f = rho + (1 - 2 rho) s, s = sigmoid(a), a = beta t / (W+ + eps), W+ = max(W, 0)
        span, clamped = 1 - 2 * choice.rho, slope.clamp(min=0)
        denominator = clamped + choice.eps
        curvature = sigmoids * (1 - sigmoids) * span / denominator  # df/da / (W+ + eps)
        argument = t * choice.beta / denominator
        slope_high = sigmoids * span + choice.rho - curvature * argument * clamped  # g = dx/dU
        slope.mul_(curvature).mul_(choice.beta)  # dx/dt = W (1 - 2 rho) s (1 - s) beta / (W+ + eps)
    else:
        slope_high = t  # g = s
        slope.mul_(t).mul_(1 - t)  # dx/dt = (U - L) s (1 - s)
    return matrix.t().to(out_dtype).reshape(batch, n, n), (slope_high, slope, positive)


class ScheduleFunction(torch.autograd.Function):
    """A transport chart (`base` "tbp" or "rtbp") with an interval `choice` (docs/rtbp_backward.md): logits
    (B, (n-1)^2) -> (B, n, n) in `out_dtype`.

    Saved for the backward, per point: g = dx/dU and dx/dt (float64) and the ramp masks [a1 > 0], [a2 > 0];
    then dx/dT = g, dx/da1 = -g [a1 > 0], dx/da2 = (1 - g) [a2 > 0]. The plain choice has g = s and
    dx/dt = (U - L) s (1 - s); the scaled one the derivatives of `ScaledChoice.point` (docs/chart_variants.md,
    'Implementation'). Double backward is not supported (`once_differentiable` raises)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, n: int, base: str, choice, out_dtype: torch.dtype):
        x, tape = _forward(logits, n, base, choice, out_dtype, True)
        ctx.save_for_backward(*tape)
        ctx.n, ctx.base, ctx.in_dtype = n, base, logits.dtype
        return x

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: torch.Tensor) -> tuple:
        slope_high, slope, positive = ctx.saved_tensors
        _, logit_slot, levels, entries = _plan(ctx.base, ctx.n, slope.device)
        batch = grad_output.shape[0]
        grad_values = slope.new_zeros(slope.shape[0] + 1, batch)
        _scatter(grad_values, entries, grad_output.reshape(batch, ctx.n * ctx.n).t().to(torch.float64))
        for start, stop, table in reversed(levels):
            points = slice(start - 1, stop - 1)
            grad_x = grad_values[start:stop]
            grad_total = grad_x * slope_high[points]
            grad_low = grad_x - grad_total  # dx/dL = 1 - g
            grad_forms = torch.cat(
                [grad_total, -grad_total * positive[0, points], grad_low * positive[1, points]]
            )
            _scatter(grad_values, table, grad_forms)
        grad_logits = (grad_values[1:] * slope).index_select(0, logit_slot).t()
        return grad_logits.to(ctx.in_dtype), None, None, None, None


def schedule_node(
    logits: torch.Tensor, n: int, base: str, out_dtype: torch.dtype, choice=PLAIN
) -> torch.Tensor:
    """Chart `base` ("tbp" or "rtbp") with the interval `choice` of logits (B, (n-1)^2) -> (B, n, n) in
    out_dtype: one autograd node when a gradient is needed, else the forward alone (decoding: no tape, no
    node)."""
    if n == 1:
        return (logits.to(out_dtype).sum(-1) + 1)[:, None, None]
    if torch.is_grad_enabled() and logits.requires_grad:
        return ScheduleFunction.apply(logits, n, base, choice, out_dtype)
    return _forward(logits, n, base, choice, out_dtype, False)[0]

"""The transport charts of a few rows evaluated on the host, for decoding on a CPU (docs/ddl_mhc.md,
'Choosing a path').

Decoding one token computes one chart per sublayer from (n-1)^2 logits: at n = 4 about a hundred float64
operations, which the node runs as some forty tensor ops of one row each, so torch's per-op overhead is the
whole cost. Here the chart's schedule (`schedule.chart_schedule`: the points' forms T, a1, a2 and the
entries, affine in the slots [1, x_1, ..., x_K]) is evaluated row by row in Python floats, which are float64:
x_k = L + (U - L) f(t_k) with L = relu(a2), U = T - relu(a1) and the interval choice's fraction f, the
entries clamped at 0 and rounded once, as in the node. The schedule of each (chart, n) is turned once into a
straight-line Python function of one row (`_row_program`, as `torch.fx` emits Python for a graph): the same
float operations in the same order as walking the forms, about three times faster. No autograd: the rule
picks this path only for CPU tensors that need no gradient (`dispatch.choose_path`); its reference is
`naive.py` (tests compare them).
"""

import functools
import math
from collections.abc import Callable

import torch

from geoformers.models.ddl_mhc.ops.charts.naive import PlainChoice, ScaledChoice
from geoformers.models.ddl_mhc.ops.charts.schedule import Terms, chart_schedule


def sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def _fraction(choice: PlainChoice | ScaledChoice, logit: float, width: float) -> float:
    """f(t) of `choice` on an interval of `width` (the node's `choice.point`, as a fraction)."""
    if isinstance(choice, PlainChoice):
        return sigmoid(logit)
    fraction = sigmoid(choice.beta * logit / (max(width, 0.0) + choice.eps))
    return choice.rho + (1 - 2 * choice.rho) * fraction


def _form(terms: Terms) -> str:
    """Python source of an affine form over the slots s0 = 1, s1, ..., summed from 0.0 in the terms' order."""
    return "".join(["(0.0", *(f" + s{slot} * {float(coefficient)!r}" for slot, coefficient in terms), ")"])


@functools.cache
def _row_program(base: str, n: int, plain: bool) -> Callable[..., list[float]]:
    """`evaluate(row, fraction)`: the chart of one row of logits as row-major entries, compiled from the
    schedule: per point, high = T - max(a1, 0), low = max(a2, 0), x = low + (high - low) f with f =
    `sigmoid(t)` written out when `plain`, else `fraction(t, high - low)`; per entry, max(form, 0)."""
    schedule = chart_schedule(base, n)
    lines = ["def evaluate(row, fraction):", "    s0 = 1.0"]
    for k, (total, first, second) in enumerate(schedule.points, start=1):
        lines.append(f"    high = {_form(total)} - max({_form(first)}, 0.0)")
        lines.append(f"    low = max({_form(second)}, 0.0)")
        lines.append(f"    t = row[{schedule.slot_logit[k - 1]}]")
        if plain:  # `sigmoid`, inline
            lines += [
                "    if t >= 0:",
                "        f = 1.0 / (1.0 + exp(-t))",
                "    else:",
                "        e = exp(t)",
            ]
            lines.append("        f = e / (1.0 + e)")
        else:
            lines.append("    f = fraction(t, high - low)")
        lines.append(f"    s{k} = low + (high - low) * f")
    lines.append(f"    return [{', '.join(f'max({_form(entry)}, 0.0)' for entry in schedule.entries)}]")
    namespace = {"exp": math.exp}
    exec(compile("\n".join(lines), f"<{base} chart, n = {n}>", "exec"), namespace)  # noqa: S102
    return namespace["evaluate"]


@functools.cache
def host_row_chart(
    base: str, n: int, choice: PlainChoice | ScaledChoice
) -> Callable[[list[float]], list[float]]:
    """Chart `base` ("tbp" or "rtbp") with interval `choice` as a function of one row of (n-1)^2 logits
    (Python floats) -> the row-major n x n entries (float64), n >= 2; ValueError for a NaN or infinite logit.
    One per (chart, n): the hyper-connection's host path (`ops/host_connection.py`) looks it up once per call
    and runs it per row."""
    plain = isinstance(choice, PlainChoice)
    evaluate = _row_program(base, n, plain)
    fraction = None if plain else functools.partial(_fraction, choice)

    def chart(row: list[float]) -> list[float]:
        if not all(map(math.isfinite, row)):
            raise ValueError("logits contain NaN or infinite values")
        return evaluate(row, fraction)

    return chart


def host_chart(logits: torch.Tensor, n: int, base: str, choice: PlainChoice | ScaledChoice) -> torch.Tensor:
    """`host_row_chart` of each row of CPU logits (B, (n-1)^2) -> (B, n, n) in their dtype, rounded once."""
    matrices = list(map(host_row_chart(base, n, choice), logits.tolist()))
    result = torch.tensor(matrices, dtype=torch.float64).view(-1, n, n)
    return result.to(logits.dtype)

"""The transport charts of a few rows evaluated on the host, for decoding on a CPU (docs/ddl_mhc.md,
'Choosing a path').

Decoding one token computes one chart per sublayer from (n-1)^2 logits: at n = 4 about a hundred float64
operations, which the node runs as some forty tensor ops of one row each, so torch's per-op overhead is the
whole cost. Here the chart's schedule (`schedule.chart_schedule`: the points' forms T, a1, a2 and the
entries, affine in the slots [1, x_1, ..., x_K]) is evaluated row by row in Python floats, which are float64:
x_k = L + (U - L) f(t_k) with L = relu(a2), U = T - relu(a1) and the interval choice's fraction f, the
entries clamped at 0 and rounded once, as in the node. No autograd: the rule picks this path only for CPU
tensors that need no gradient (`dispatch.choose_path`); its reference is `naive.py` (tests compare them).
"""

import math

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


def _form(slots: list[float], terms: Terms) -> float:
    total = 0.0
    for slot, coefficient in terms:
        total += slots[slot] * coefficient
    return total


def host_chart_rows(
    rows: list[list[float]], n: int, base: str, choice: PlainChoice | ScaledChoice
) -> list[list[float]]:
    """Chart `base` ("tbp" or "rtbp") with interval `choice` of logit rows ((n-1)^2 Python floats each) -> one
    row-major list of the n x n entries per row, in Python floats (float64), n >= 2. ValueError for a NaN or
    infinite logit. The host path of the hyper-connection (`ops/host_connection.py`) calls it directly."""
    schedule = chart_schedule(base, n)
    matrices = []
    for row in rows:
        if not all(map(math.isfinite, row)):
            raise ValueError("logits contain NaN or infinite values")
        slots = [1.0] + [0.0] * len(schedule.points)
        for k, (total, first, second) in enumerate(schedule.points, start=1):
            high = _form(slots, total) - max(_form(slots, first), 0.0)
            low = max(_form(slots, second), 0.0)
            width = high - low
            slots[k] = low + width * _fraction(choice, row[schedule.slot_logit[k - 1]], width)
        matrices.append([max(_form(slots, entry), 0.0) for entry in schedule.entries])
    return matrices


def host_chart(logits: torch.Tensor, n: int, base: str, choice: PlainChoice | ScaledChoice) -> torch.Tensor:
    """`host_chart_rows` of CPU logits (B, (n-1)^2) -> (B, n, n) in their dtype, rounded once."""
    matrices = host_chart_rows(logits.tolist(), n, base, choice)
    result = torch.tensor(matrices, dtype=torch.float64).view(-1, n, n)
    return result.to(logits.dtype)

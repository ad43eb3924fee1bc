"""Triton kernels for the transport charts: "tbp", "rtbp" and every variant of the chart table
(`chart_specs.py`: the interval choices, the averaged orderings of "atbp") (docs/ddl_mhc.md, 'GPU
path'); the dispatcher imports this module lazily, only when triton is installed and the kernels should run.

Both base charts run their `schedule.chart_schedule`: (n-1)^2 interval points, one per logit t_k,

    x_k = L + (U - L) f(t_k),   L = relu(a2),   U = T - relu(a1),

with T, a1, a2 and every matrix entry affine in the slots [1, x_1, ..., x_K], and the interval choice's
fraction f (`naive.PlainChoice`, `naive.ScaledChoice`) a parameter of the kernel. `_tables` lays the schedule
out densely; one kernel runs any schedule and choice, a program per block of matrices with the slots in
registers, and the backward kernel recomputes the slots and sweeps the points in reverse (nothing is saved
but the logits). Ties follow `naive.py` (relu'(0) = 0, U = r when r = c), so the gradients match its
autograd.

Arithmetic is float64 and each entry is rounded once: the masses reach n-1, which float32 would cancel.
The chart costs O(n^4) flops per matrix against O(d^2) for the sublayer around it, so even a 1/64-rate
float64 unit leaves it far below the GEMMs, and the result is the reference's to float64 rounding
(|row/column sum - 1| <= ~n 6e-8 in float32).
"""

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from geoformers.models.ddl_mhc.chart_specs import CHARTS, TRANSPORT_CHARTS
from geoformers.models.ddl_mhc.ops.charts.naive import INTERVAL_CHOICES, ScaledChoice, average
from geoformers.models.ddl_mhc.ops.charts.schedule import chart_schedule
from geoformers.models.ddl_mhc.ops.constant_cache import constant_cache

KERNEL_CHARTS = tuple(name for name, spec in CHARTS.items() if spec.base in TRANSPORT_CHARTS)


@constant_cache
def _tables(base: str, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(points (K, 3, P) float64, logit index (K,) int32, entries (n*n, P) float64) of a chart's schedule,
    P the slot count rounded up to a power of two."""
    schedule = chart_schedule(base, n)
    padded = triton.next_power_of_2(len(schedule.slot_logit) + 1)
    points = torch.zeros(len(schedule.points), 3, padded, dtype=torch.float64)
    for k, forms in enumerate(schedule.points):
        for part, form in enumerate(forms):
            for slot, value in form:
                points[k, part, slot] = value
    table = torch.zeros(n * n, padded, dtype=torch.float64)
    for e, form in enumerate(schedule.entries):
        for slot, value in form:
            table[e, slot] = value
    index = torch.tensor(schedule.slot_logit, dtype=torch.int32)
    return points.to(device), index.to(device), table.to(device)


@triton.jit
def _sigmoid(logit):
    """(sigmoid(t), 1 - sigmoid(t)) in float64, from exp(-|t|) so that neither overflows nor cancels."""
    t = logit.to(tl.float64)
    decay = tl.exp(-tl.abs(t))
    high, low = 1.0 / (1.0 + decay), decay / (1.0 + decay)
    return tl.where(t >= 0, high, low), tl.where(t >= 0, low, high)


@constant_cache
def _choice_parameters(choice, device: torch.device) -> torch.Tensor:
    """(beta, eps, rho) of a `ScaledChoice` as float64 (3,), loaded by the kernels so that they compute with
    the float64 values (a Python float argument would reach them as float32); zeros for the plain choice."""
    values = (choice.beta, choice.eps, choice.rho) if isinstance(choice, ScaledChoice) else (0.0, 0.0, 0.0)
    return torch.tensor(values, dtype=torch.float64, device=device)


@triton.jit
def _point(logit, total, over_first, over_second, choice_ptr, SCALED: tl.constexpr):
    """The interval point x = L + W f, L = relu(a2), W = T - relu(a1) - L, and its derivatives
    (dx/dU, dx/dt) (docs/chart_variants.md, 'Implementation'): plain f = s = sigmoid(t), dx/dU = s,
    dx/dt = W s (1 - s); scaled f = rho + (1 - 2 rho) s, s = sigmoid(a), a = beta t / (W+ + eps)."""
    low = tl.maximum(over_second, 0.0)
    width = total - tl.maximum(over_first, 0.0) - low
    if SCALED:
        beta, eps, rho = tl.load(choice_ptr), tl.load(choice_ptr + 1), tl.load(choice_ptr + 2)
        clamped = tl.maximum(width, 0.0)
        denominator = clamped + eps
        argument = logit.to(tl.float64) * beta / denominator
        s, one_minus_s = _sigmoid(argument)
        span = 1.0 - 2.0 * rho
        fraction = rho + span * s
        curvature = span * s * one_minus_s / denominator
        slope_high = fraction - curvature * argument * clamped
        slope_t = curvature * width * beta
    else:
        s, one_minus_s = _sigmoid(logit)
        fraction = s
        slope_high = s
        slope_t = width * s * one_minus_s
    return low + width * fraction, slope_high, slope_t


@triton.jit
def _slots(
    logits_ptr, points_ptr, index_ptr, choice_ptr, lanes, live,
    K: tl.constexpr, P: tl.constexpr, BLOCK: tl.constexpr, SCALED: tl.constexpr,
):  # fmt: skip
    """The slots [1, x_1, ..., x_K] (BLOCK, P) float64 of the tape, for the matrices in `lanes`."""
    slot = tl.arange(0, P)[None, :]
    values = tl.where(slot == 0, 1.0, 0.0).to(tl.float64) + tl.zeros((BLOCK, P), tl.float64)
    for k in range(K):
        forms = points_ptr + k * 3 * P + tl.arange(0, P)
        total = tl.sum(values * tl.load(forms)[None, :], axis=1)
        over_first = tl.sum(values * tl.load(forms + P)[None, :], axis=1)
        over_second = tl.sum(values * tl.load(forms + 2 * P)[None, :], axis=1)
        logit = tl.load(logits_ptr + lanes * K + tl.load(index_ptr + k), mask=live, other=0.0)
        x, _, _ = _point(logit, total, over_first, over_second, choice_ptr, SCALED)
        values = tl.where(slot == k + 1, x[:, None], values)
    return values


@triton.jit
def _chart_forward_kernel(
    logits_ptr, points_ptr, index_ptr, table_ptr, choice_ptr, out_ptr, batch,
    K: tl.constexpr, NN: tl.constexpr, P: tl.constexpr, BLOCK: tl.constexpr, SCALED: tl.constexpr,
):  # fmt: skip
    lanes = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = lanes < batch
    values = _slots(logits_ptr, points_ptr, index_ptr, choice_ptr, lanes, live, K, P, BLOCK, SCALED)
    for e in range(NN):
        entry = tl.sum(values * tl.load(table_ptr + e * P + tl.arange(0, P))[None, :], axis=1)
        # Every entry is >= 0 in exact arithmetic; the clamp only removes float64 rounding below 0.
        tl.store(out_ptr + lanes * NN + e, tl.maximum(entry, 0.0).to(out_ptr.dtype.element_ty), mask=live)


@triton.jit
def _chart_backward_kernel(
    logits_ptr, points_ptr, index_ptr, table_ptr, choice_ptr, grad_out_ptr, grad_ptr, batch,
    K: tl.constexpr, NN: tl.constexpr, P: tl.constexpr, BLOCK: tl.constexpr, SCALED: tl.constexpr,
):  # fmt: skip
    lanes = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = lanes < batch
    slot = tl.arange(0, P)
    values = _slots(logits_ptr, points_ptr, index_ptr, choice_ptr, lanes, live, K, P, BLOCK, SCALED)
    adjoint = tl.zeros((BLOCK, P), tl.float64)  # dL/d slot, through the affine entries
    for e in range(NN):
        g = tl.load(grad_out_ptr + lanes * NN + e, mask=live, other=0.0).to(tl.float64)
        adjoint += g[:, None] * tl.load(table_ptr + e * P + slot)[None, :]
    for step in range(K):
        k = K - 1 - step
        forms = points_ptr + k * 3 * P + slot
        form_total, form_first, form_second = tl.load(forms), tl.load(forms + P), tl.load(forms + 2 * P)
        total = tl.sum(values * form_total[None, :], axis=1)
        over_first = tl.sum(values * form_first[None, :], axis=1)
        over_second = tl.sum(values * form_second[None, :], axis=1)
        j = tl.load(index_ptr + k)
        logit = tl.load(logits_ptr + lanes * K + j, mask=live, other=0.0)
        _, slope_high, slope_t = _point(logit, total, over_first, over_second, choice_ptr, SCALED)
        grad_x = tl.sum(tl.where(slot[None, :] == k + 1, adjoint, 0.0), axis=1)
        tl.store(grad_ptr + lanes * K + j, (grad_x * slope_t).to(grad_ptr.dtype.element_ty), mask=live)
        # x = L + (U - L) f with U = T - relu(a1), L = relu(a2), a1 = T - C1, a2 = T - C2 (relu'(0) = 0):
        # dx/dT = g, dx/da1 = -g [a1 > 0], dx/da2 = (1 - g) [a2 > 0], g = dx/dU.
        d_first = tl.where(over_first > 0, -slope_high, 0.0)
        d_second = tl.where(over_second > 0, 1.0 - slope_high, 0.0)
        adjoint += grad_x[:, None] * (
            slope_high[:, None] * form_total[None, :]
            + d_first[:, None] * form_first[None, :]
            + d_second[:, None] * form_second[None, :]
        )


def _launch(logits: torch.Tensor, n: int, base: str, choice) -> tuple[tuple, dict]:
    points, index, table = _tables(base, n, logits.device)
    batch = logits.shape[0]
    padded = points.shape[-1]
    block = min(triton.next_power_of_2(max(batch, 1)), max(4, 1024 // padded))
    meta = {"K": points.shape[0], "NN": n * n, "P": padded, "BLOCK": block}
    meta["SCALED"] = isinstance(choice, ScaledChoice)
    tables = (points, index, table, _choice_parameters(choice, logits.device))
    return tables, {"grid": (triton.cdiv(batch, block),), "meta": meta}


class TritonChart(torch.autograd.Function):
    """Transport chart `base` with the interval `choice` of logits (B, (n-1)^2) -> (B, n, n), forward and
    backward in Triton."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, n: int, base: str, choice) -> torch.Tensor:
        tables, launch = _launch(logits, n, base, choice)
        out = logits.new_empty(logits.shape[0], n, n)
        _chart_forward_kernel[launch["grid"]](logits, *tables, out, logits.shape[0], **launch["meta"])
        ctx.save_for_backward(logits)
        ctx.n, ctx.base, ctx.choice = n, base, choice
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: torch.Tensor):
        (logits,) = ctx.saved_tensors
        tables, launch = _launch(logits, ctx.n, ctx.base, ctx.choice)
        grad = torch.empty_like(logits)
        grad_output = grad_output.to(logits.dtype).contiguous()
        _chart_backward_kernel[launch["grid"]](
            logits, *tables, grad_output, grad, logits.shape[0], **launch["meta"]
        )
        return grad, None, None, None


def triton_chart(logits: torch.Tensor, n: int, method: str) -> torch.Tensor:
    """Chart `method` (one of KERNEL_CHARTS: a transport chart of the table) of logits
    (B, num_logits(method, n)), n >= 2, B >= 1, float32 or float64, -> (B, n, n) in the logits' dtype; the
    dispatcher `birkhoff` checks and shapes the input. Averaged orderings ("atbp") mix the kernel's charts in
    float64 (`naive.average`)."""
    if method not in KERNEL_CHARTS:
        raise ValueError(f"triton_chart supports method in {KERNEL_CHARTS}, got {method!r}")
    spec = CHARTS[method]
    choice = INTERVAL_CHOICES[spec.interval]
    if len(spec.orderings) == 1:
        return TritonChart.apply(logits.contiguous(), n, spec.base, choice)

    def chart(t: torch.Tensor, n: int) -> torch.Tensor:
        return TritonChart.apply(t.contiguous(), n, spec.base, choice)

    return average(logits.double(), n, chart, spec.orderings).to(logits.dtype)

"""Triton kernels for the exact doubly-stochastic charts "tbp" and "rtbp" of `birkhoff.py`.

Both charts are a fixed sequence of (n-1)^2 interval points, one per logit t_k (`birkhoff.py`):

    x_k = L + (U - L) sigmoid(t_k),   L = relu(T - C2),   U = T - relu(T - C1)

where the total T and the capacities C1, C2 are affine in the earlier x's (remaining row / column / block
masses), and every matrix entry is affine in the x's too (TBP: X[i, j] = x for i, j < n-1, the last row
and column are the remaining masses). `_chart_tape` records that sequence once per (chart, n) as tables
of affine coefficients over the slots [1, x_1, ..., x_K]; one kernel runs any tape, a program per block
of matrices with the slots in registers, and the backward kernel recomputes the slots and sweeps the
tape in reverse (nothing is saved but the logits). Ties follow `birkhoff.py` (relu'(0) = 0, U = r when
r = c), so the gradients match its backward.

Arithmetic is float64 and each entry is rounded once, as in `birkhoff.py`: the masses reach n-1, which
float32 would cancel. The chart costs O(n^4) flops per matrix against O(d^2) for the sublayer around it,
so even a 1/64-rate float64 unit leaves it far below the GEMMs, and the result is the reference's to
float64 rounding (|row/column sum - 1| <= ~n 6e-8 in float32).
"""

from functools import cache

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from geoformers.modeling.birkhoff import _check_logits, num_logits

CHARTS = ("tbp", "rtbp")


class _Tape:
    """Affine forms over the slots [1, x_1, ..., x_K] (float64 coefficient vectors) and the interval
    points that define x_1, ..., x_K in order, each with its logit index."""

    def __init__(self, num_points: int):
        self.size = num_points + 1
        self.points: list[tuple[int, torch.Tensor]] = []

    def const(self, value: float) -> torch.Tensor:
        form = torch.zeros(self.size, dtype=torch.float64)
        form[0] = value
        return form

    def point(self, total: torch.Tensor, cap_first: torch.Tensor, cap_second: torch.Tensor, logit: int):
        """New slot x = L + (U - L) s with L = relu(total - cap_second), U = total - relu(total - cap_first).
        The differences are stored as one form each, so a structurally zero one evaluates to exactly 0."""
        self.points.append((logit, torch.stack([total, total - cap_first, total - cap_second])))
        form = torch.zeros(self.size, dtype=torch.float64)
        form[len(self.points)] = 1.0
        return form


def _tbp_tape(tape: _Tape, n: int) -> list[list[torch.Tensor]]:
    """TBP, north-west corner in row-major order: entry (i, j) reads the remaining row mass r, column mass
    c and the mass D below-right of (i, j-1); L = max(0, c - D), U = min(r, c) (T = r, C1 = c, C2 = r-c+D)."""
    cols = [tape.const(1.0) for _ in range(n - 1)]
    matrix, row_rests = [], []
    for i in range(n - 1):
        rest, below = tape.const(1.0), tape.const(n - 1.0 - i)
        row = []
        for j in range(n - 1):
            x = tape.point(rest, cols[j], rest - cols[j] + below, i * (n - 1) + j)
            rest, cols[j] = rest - x, cols[j] - x
            below = below - cols[j]
            row.append(x)
        matrix.append([*row, rest])
        row_rests.append(rest)
    matrix.append([*cols, tape.const(1.0) - sum(row_rests)])
    return matrix


def _split_tape(tape: _Tape, caps: list, total: torch.Tensor, logits: list[int]) -> list:
    """`birkhoff._split`: `total` over slots with capacities `caps`; the first ceil(m/2) slots get a mass in
    [max(0, total - cap_2), min(total, cap_1)], then both halves recurse."""
    if len(caps) == 1:
        return [total]
    half = (len(caps) + 1) // 2
    first = tape.point(total, sum(caps[:half]), sum(caps[half:]), logits[0])
    rest = logits[1:]
    return _split_tape(tape, caps[:half], first, rest[: half - 1]) + _split_tape(
        tape, caps[half:], total - first, rest[half - 1 :]
    )


def _rtbp_tape(tape: _Tape, rows: list, cols: list, logits: list[int]) -> list[list[torch.Tensor]]:
    """`birkhoff._rtbp_transport` on one transport problem, with its logit order."""
    n = len(rows)
    if n == 1:
        return [[rows[0]]]
    if n % 2 == 1:
        last_col = _split_tape(tape, rows, cols[-1], logits[: n - 1])
        corner = last_col[-1]
        last_row = _split_tape(tape, cols[:-1], rows[-1] - corner, logits[n - 1 : 2 * n - 3])
        inner = _rtbp_tape(
            tape,
            [r - x for r, x in zip(rows[:-1], last_col[:-1], strict=True)],
            [c - x for c, x in zip(cols[:-1], last_row, strict=True)],
            logits[2 * n - 3 :],
        )
        return [[*row, x] for row, x in zip(inner, last_col[:-1], strict=True)] + [[*last_row, corner]]
    h = n // 2
    top, bottom, left, right = rows[:h], rows[h:], cols[:h], cols[h:]
    top_mass, left_mass = sum(top), sum(left)
    mass_tl = tape.point(top_mass, left_mass, sum(right), logits[0])
    splits = [logits[1 + k * (h - 1) : 1 + (k + 1) * (h - 1)] for k in range(4)]
    rows_tl = _split_tape(tape, top, mass_tl, splits[0])
    rows_bl = _split_tape(tape, bottom, left_mass - mass_tl, splits[1])
    cols_tl = _split_tape(tape, left, mass_tl, splits[2])
    cols_tr = _split_tape(tape, right, top_mass - mass_tl, splits[3])

    def minus(a, b):
        return [x - y for x, y in zip(a, b, strict=True)]

    child_rows = [rows_tl, minus(top, rows_tl), rows_bl, minus(bottom, rows_bl)]
    child_cols = [cols_tl, cols_tr, minus(left, cols_tl), minus(right, cols_tr)]
    start, size = 1 + 4 * (h - 1), (h - 1) ** 2
    children = [
        _rtbp_tape(tape, child_rows[k], child_cols[k], logits[start + k * size : start + (k + 1) * size])
        for k in range(4)
    ]
    return [[children[2 * (i // h) + j // h][i % h][j % h] for j in range(n)] for i in range(n)]


@cache
def _chart_tape(method: str, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(points (K, 3, P) float64, logit index (K,) int32, entries (n*n, P) float64) of a chart, P the slot
    count rounded up to a power of two."""
    num_points = num_logits(method, n)
    tape = _Tape(num_points)
    if method == "tbp":
        matrix = _tbp_tape(tape, n)
    else:
        ones = [tape.const(1.0) for _ in range(n)]
        matrix = _rtbp_tape(tape, ones, ones, list(range(num_points)))
    entries = [x for row in matrix for x in row]
    padded = triton.next_power_of_2(tape.size)
    points = torch.zeros(num_points, 3, padded, dtype=torch.float64)
    points[:, :, : tape.size] = torch.stack([forms for _, forms in tape.points])
    index = torch.tensor([logit for logit, _ in tape.points], dtype=torch.int32)
    table = torch.zeros(n * n, padded, dtype=torch.float64)
    table[:, : tape.size] = torch.stack(entries)
    return points.to(device), index.to(device), table.to(device)


@triton.jit
def _sigmoid(logit):
    """(sigmoid(t), 1 - sigmoid(t)) in float64, from exp(-|t|) so that neither overflows nor cancels."""
    t = logit.to(tl.float64)
    decay = tl.exp(-tl.abs(t))
    high, low = 1.0 / (1.0 + decay), decay / (1.0 + decay)
    return tl.where(t >= 0, high, low), tl.where(t >= 0, low, high)


@triton.jit
def _slots(
    logits_ptr, points_ptr, index_ptr, lanes, live, K: tl.constexpr, P: tl.constexpr, BLOCK: tl.constexpr
):
    """The slots [1, x_1, ..., x_K] (BLOCK, P) float64 of the tape, for the matrices in `lanes`."""
    slot = tl.arange(0, P)[None, :]
    values = tl.where(slot == 0, 1.0, 0.0).to(tl.float64) + tl.zeros((BLOCK, P), tl.float64)
    for k in range(K):
        forms = points_ptr + k * 3 * P + tl.arange(0, P)
        total = tl.sum(values * tl.load(forms)[None, :], axis=1)
        over_first = tl.sum(values * tl.load(forms + P)[None, :], axis=1)
        over_second = tl.sum(values * tl.load(forms + 2 * P)[None, :], axis=1)
        s, _ = _sigmoid(tl.load(logits_ptr + lanes * K + tl.load(index_ptr + k), mask=live, other=0.0))
        low = tl.maximum(over_second, 0.0)
        x = low + (total - tl.maximum(over_first, 0.0) - low) * s
        values = tl.where(slot == k + 1, x[:, None], values)
    return values


@triton.jit
def _chart_forward_kernel(
    logits_ptr, points_ptr, index_ptr, table_ptr, out_ptr, batch,
    K: tl.constexpr, NN: tl.constexpr, P: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    lanes = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = lanes < batch
    values = _slots(logits_ptr, points_ptr, index_ptr, lanes, live, K, P, BLOCK)
    for e in range(NN):
        entry = tl.sum(values * tl.load(table_ptr + e * P + tl.arange(0, P))[None, :], axis=1)
        # Every entry is >= 0 in exact arithmetic; the clamp only removes float64 rounding below 0.
        tl.store(out_ptr + lanes * NN + e, tl.maximum(entry, 0.0).to(out_ptr.dtype.element_ty), mask=live)


@triton.jit
def _chart_backward_kernel(
    logits_ptr, points_ptr, index_ptr, table_ptr, grad_out_ptr, grad_ptr, batch,
    K: tl.constexpr, NN: tl.constexpr, P: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    lanes = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = lanes < batch
    slot = tl.arange(0, P)
    values = _slots(logits_ptr, points_ptr, index_ptr, lanes, live, K, P, BLOCK)
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
        s, one_minus_s = _sigmoid(tl.load(logits_ptr + lanes * K + j, mask=live, other=0.0))
        low = tl.maximum(over_second, 0.0)
        width = total - tl.maximum(over_first, 0.0) - low
        grad_x = tl.sum(tl.where(slot[None, :] == k + 1, adjoint, 0.0), axis=1)
        tl.store(
            grad_ptr + lanes * K + j,
            (grad_x * width * s * one_minus_s).to(grad_ptr.dtype.element_ty),
            mask=live,
        )
        # x = relu(C2') + (T - relu(C1') - relu(C2')) s with C1' = T - C1, C2' = T - C2 (relu'(0) = 0).
        d_first = tl.where(over_first > 0, -s, 0.0)
        d_second = tl.where(over_second > 0, one_minus_s, 0.0)
        adjoint += grad_x[:, None] * (
            s[:, None] * form_total[None, :]
            + d_first[:, None] * form_first[None, :]
            + d_second[:, None] * form_second[None, :]
        )


def _launch(logits: torch.Tensor, n: int, method: str) -> tuple[tuple, dict]:
    points, index, table = _chart_tape(method, n, logits.device)
    batch = logits.shape[0]
    padded = points.shape[-1]
    block = min(triton.next_power_of_2(max(batch, 1)), max(4, 1024 // padded))
    meta = {"K": points.shape[0], "NN": n * n, "P": padded, "BLOCK": block}
    return (points, index, table), {"grid": (triton.cdiv(batch, block),), "meta": meta}


class _TritonChart(torch.autograd.Function):
    """tbp / rtbp chart of logits (B, (n-1)^2) -> (B, n, n), forward and backward in Triton."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, n: int, method: str) -> torch.Tensor:
        tables, launch = _launch(logits, n, method)
        out = logits.new_empty(logits.shape[0], n, n)
        _chart_forward_kernel[launch["grid"]](logits, *tables, out, logits.shape[0], **launch["meta"])
        ctx.save_for_backward(logits)
        ctx.n, ctx.method = n, method
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: torch.Tensor):
        (logits,) = ctx.saved_tensors
        tables, launch = _launch(logits, ctx.n, ctx.method)
        grad = torch.empty_like(logits)
        grad_output = grad_output.to(logits.dtype).contiguous()
        _chart_backward_kernel[launch["grid"]](
            logits, *tables, grad_output, grad, logits.shape[0], **launch["meta"]
        )
        return grad, None, None


def triton_birkhoff(logits: torch.Tensor, n: int, method: str = "rtbp") -> torch.Tensor:
    """`birkhoff(logits, n, method)` for method "tbp" or "rtbp" with Triton kernels: logits
    (..., (n-1)^2) -> (..., n, n), float32 (float64 for float64 logits), autocast ignored."""
    if method not in CHARTS:
        raise ValueError(f"triton_birkhoff supports method in {CHARTS}, got {method!r}")
    _check_logits(logits, n, method)  # birkhoff()'s checks: n, dtype, shape, finite values
    batch_shape = logits.shape[:-1]
    out_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    if n == 1:
        return torch.ones(*batch_shape, 1, 1, dtype=out_dtype, device=logits.device)
    flat = logits.reshape(-1, logits.shape[-1]).to(out_dtype).contiguous()
    if flat.shape[0] == 0:
        return flat.new_empty(*batch_shape, n, n)
    return _TritonChart.apply(flat, n, method).view(*batch_shape, n, n)

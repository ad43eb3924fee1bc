"""RTBP as one autograd node (`models/ddl_mhc/ops/charts/rtbp_node.py`, docs/rtbp_backward.md) against its
references: the plain-autograd `naive.rtbp` (outputs and gradients, incl. saturated logits and ties), the
plain-Python `chart_references.rtbp_reference`, finite differences (gradcheck), and the float32 path; and the
schedule it shares with the Triton kernels (`schedule.chart_schedule`), TBP's included. The interval
choices of the variants are checked in test_chart_variants.py."""

import pytest
import torch
from chart_references import rtbp_reference

from geoformers.models.ddl_mhc.ops.charts import birkhoff, ds_violation
from geoformers.models.ddl_mhc.ops.charts.naive import PLAIN, rtbp, tbp
from geoformers.models.ddl_mhc.ops.charts.rtbp_node import ScheduleFunction, _plan, schedule_node
from geoformers.models.ddl_mhc.ops.charts.schedule import chart_schedule

SIZES = range(1, 10)


def rtbp_schedule(logits: torch.Tensor, n: int, out_dtype: torch.dtype) -> torch.Tensor:
    """The chart table's RTBP node (plain choice)."""
    return schedule_node(logits, n, "rtbp", out_dtype)


def _logits(n: int, kind: str, generator: torch.Generator, batch: int = 40) -> torch.Tensor:
    """N(0, 1), N(0, 30^2) (many sigmoids exactly 1 or below 1e-13), saturated (sigmoids exactly 0, 1 or
    1/2: every mass dyadic, every tie exact), or all zero (the model's initialisation: ties T = C)."""
    size = (batch, (n - 1) ** 2)
    if kind == "normal":
        return torch.randn(size, generator=generator, dtype=torch.float64)
    if kind == "large":
        return 30 * torch.randn(size, generator=generator, dtype=torch.float64)
    if kind == "saturated":
        values = torch.tensor([1e3, -1e3, 50.0, 0.0], dtype=torch.float64)
        return values[torch.randint(len(values), size, generator=generator)]
    return torch.zeros(size, dtype=torch.float64)


@pytest.mark.parametrize("kind", ["normal", "large", "saturated", "zero"])
@pytest.mark.parametrize("n", SIZES)
def test_matches_autograd_reference_in_float64(n, kind):
    generator = torch.Generator().manual_seed(n)
    logits = _logits(n, kind, generator)
    fast_in, ref_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    fast = rtbp_schedule(fast_in, n, torch.float64)
    ref = rtbp(ref_in, n)
    assert fast.dtype == torch.float64 and fast.shape == (40, n, n)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-12)
    assert float(fast.detach().min()) >= 0.0  # exactly, like the reference's straight-through clamp
    assert float(ds_violation(fast).max()) <= 1e-14
    if n == 1:  # no logits, nothing to differentiate
        return
    upstream = torch.randn(fast.shape, generator=generator, dtype=torch.float64)
    (grad_fast,) = torch.autograd.grad((fast * upstream).sum(), fast_in)
    (grad_ref,) = torch.autograd.grad((ref * upstream).sum(), ref_in)
    torch.testing.assert_close(grad_fast, grad_ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("n", (4, 7))
def test_rounding_decided_ties_agree_in_value(n):
    """Saturated sigmoids beside generic ones put masses exactly on their capacities, where T - C is a
    rounding residue (+-1e-17) whose sign picks relu's side; the two implementations round differently, so
    there the gradients are different one-sided derivatives (docs/rtbp_backward.md, "Ties"); the charts
    agree, and both gradients are finite."""
    generator = torch.Generator().manual_seed(n)
    values = torch.tensor([1e3, -1e3, 40.0, -40.0, 0.0, -3.0, 2.0], dtype=torch.float64)
    logits = values[torch.randint(len(values), (40, (n - 1) ** 2), generator=generator)].requires_grad_()
    fast, ref = rtbp_schedule(logits, n, torch.float64), rtbp(logits, n)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-12)
    (grad,) = torch.autograd.grad(fast.sum(), logits)
    assert bool(torch.isfinite(grad).all())


@pytest.mark.parametrize("n", range(2, 8))
def test_matches_plain_python_reference(n):
    generator = torch.Generator().manual_seed(10 + n)
    logits = torch.cat([_logits(n, "normal", generator, 3) * 3, _logits(n, "saturated", generator, 2)])
    expected = torch.tensor([rtbp_reference(row.tolist(), n) for row in logits], dtype=torch.float64)
    torch.testing.assert_close(rtbp_schedule(logits, n, torch.float64), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(rtbp(logits, n), expected, rtol=0, atol=1e-12)  # the naive reference too


@pytest.mark.parametrize("n", (2, 3, 4, 5, 6, 8))
def test_gradcheck_float64(n):
    generator = torch.Generator().manual_seed(20 + n)
    logits = (2 * torch.randn(3, (n - 1) ** 2, generator=generator, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: ScheduleFunction.apply(t, n, "rtbp", PLAIN, torch.float64), (logits,)
    )


def test_float32_logits_give_float32_chart_and_gradient():
    n = 6
    generator = torch.Generator().manual_seed(3)
    logits = 3 * torch.randn(50, (n - 1) ** 2, generator=generator)
    upstream = torch.randn(50, n, n, generator=generator)
    single = logits.clone().requires_grad_()
    double = logits.double().requires_grad_()
    x32, x64 = rtbp_schedule(single, n, torch.float32), rtbp(double, n)
    assert x32.dtype == torch.float32
    assert torch.equal(x32, x64.float())  # float64 arithmetic, the finished matrix rounded once
    assert float(ds_violation(x32).max()) <= 6e-8 * n
    (x32 * upstream).sum().backward()
    (x64 * upstream.double()).sum().backward()
    assert single.grad.dtype == torch.float32
    torch.testing.assert_close(single.grad.double(), double.grad, rtol=0, atol=1e-6)


def test_no_grad_forward_equals_the_node_and_birkhoff_runs_it():
    n = 5
    logits = torch.randn(7, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        plain = rtbp_schedule(logits, n, torch.float64)
    leaf = logits.clone().requires_grad_()
    node = rtbp_schedule(leaf, n, torch.float64)
    assert torch.equal(plain, node.detach())
    assert type(node.grad_fn).__name__ == "ScheduleFunctionBackward"
    chart = birkhoff(leaf.view(7, 1, 16), n, "rtbp")
    assert "ScheduleFunctionBackward" in repr(chart.grad_fn.next_functions)
    torch.testing.assert_close(chart.view(7, n, n), node, rtol=0, atol=0)


def test_double_backward_raises_a_clear_error():
    """Like TBP's node, the backward is once-differentiable: a second derivative raises torch's error."""
    logits = torch.randn(2, 9, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(
        (rtbp_schedule(logits, 4, torch.float64) * weights).sum(), logits, create_graph=True
    )
    with pytest.raises(
        RuntimeError, match="differentiate twice a function that was marked with @once_differentiable"
    ):
        grad.sum().backward()


def test_empty_batch():
    logits = torch.zeros(0, 9, requires_grad=True)
    x = rtbp_schedule(logits, 4, torch.float32)
    assert x.shape == (0, 4, 4)
    x.sum().backward()
    assert logits.grad.shape == (0, 9)


@pytest.mark.parametrize("n, levels", [(2, 1), (3, 3), (4, 3), (8, 5), (16, 7)])
def test_plan_levels_and_logit_order(n, levels):
    """Each logit is read exactly once, and the points run in few batched levels (n = 4: the top block,
    the four splits, the four 2 x 2 children)."""
    slot_logit, logit_slot, plan_levels, _ = _plan("rtbp", n, torch.device("cpu"))
    assert len(plan_levels) == levels
    assert sorted(slot_logit.tolist()) == list(range((n - 1) ** 2))
    assert torch.equal(slot_logit[logit_slot], torch.arange((n - 1) ** 2))
    assert plan_levels[-1][1] == (n - 1) ** 2 + 1  # the levels' slots cover x_1 ... x_K


@pytest.mark.parametrize("kind", ["normal", "large", "saturated", "zero"])
@pytest.mark.parametrize("n", (2, 3, 4, 5, 7))
def test_tbp_schedule_matches_the_naive_tbp(n, kind):
    """The node on TBP's schedule (what the Triton kernels run) against `naive.tbp`: values and gradients."""
    generator = torch.Generator().manual_seed(30 + n)
    logits = _logits(n, kind, generator, batch=12)
    fast_in, ref_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    fast, ref = schedule_node(fast_in, n, "tbp", torch.float64), tbp(ref_in, n)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-12)
    upstream = torch.randn(fast.shape, generator=generator, dtype=torch.float64)
    (grad_fast,) = torch.autograd.grad((fast * upstream).sum(), fast_in)
    (grad_ref,) = torch.autograd.grad((ref * upstream).sum(), ref_in)
    torch.testing.assert_close(grad_fast, grad_ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("n", (2, 3, 5, 8))
def test_tbp_schedule_runs_by_anti_diagonals(n):
    """The one schedule records TBP too (for the Triton kernels): its levels are the 2n-3 anti-diagonals,
    point k reads only earlier slots, and every logit is read once."""
    schedule = chart_schedule("tbp", n)
    sizes = [stop - start for start, stop in schedule.levels]
    assert sizes == [min(d, 2 * n - 4 - d) + 1 for d in range(2 * n - 3)]
    assert sorted(schedule.slot_logit) == list(range((n - 1) ** 2))
    for start, stop in schedule.levels:
        for k in range(start, stop):
            assert all(slot < start for form in schedule.points[k - 1] for slot, _ in form)

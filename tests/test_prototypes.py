"""DDCL prototype block: the exact split L_q = L_OLS + V, temperatures, assignments, diagnostics."""

import math

import pytest
import torch

from geoformers.models.ddcl_incrt.prototypes import (
    PrototypeBank,
    assignment_perplexity,
    min_pairwise_distance,
    prototype_block,
    rho_for_temperature,
    temperature_from_rho,
)


def direct_reference(points, prototypes, tau):
    """fp64 reference with explicit differences o - p_k (no expanded squared norms)."""
    points, prototypes, tau = points.double(), prototypes.double(), tau.double()
    differences = points[:, :, :, None, :] - prototypes[None, :, None, :, :]
    distances = differences.pow(2).sum(-1)
    assignments = torch.softmax(-distances / tau[None, :, None, None], dim=-1)
    output = (assignments[..., None] * prototypes[None, :, None]).sum(-2)
    l_q = (assignments * distances).sum(-1)
    l_ols = (points - output).pow(2).sum(-1)
    spread = (prototypes[None, :, None] - output[:, :, :, None, :]).pow(2).sum(-1)
    variance = (assignments * spread).sum(-1)
    return output, assignments, l_ols, variance, l_q


@pytest.mark.parametrize("tau", [0.01, 0.05, 0.3, 1.0, 10.0, 1000.0])
def test_identity_holds_in_float32_for_random_inputs(tau):
    generator = torch.Generator().manual_seed(0)
    points = torch.randn(3, 2, 7, 16, generator=generator)
    prototypes = torch.randn(2, 8, 16, generator=generator)
    result = prototype_block(points, prototypes, torch.full((2,), tau))
    relative = (result.l_q - result.l_ols - result.variance).abs() / result.l_q
    assert relative.max() < 1e-5
    assert (result.variance >= 0).all() and (result.l_ols >= 0).all()


@pytest.mark.parametrize("tau", [1e-3, 0.1, 1.0, 100.0])
@pytest.mark.parametrize("offset", [1e-2, 1e-4])
def test_identity_next_to_prototypes(tau, offset):
    """Points within `offset` of a prototype: L_q is tiny, the regime of sharp (local) heads."""
    generator = torch.Generator().manual_seed(1)
    prototypes = torch.randn(2, 6, 8, generator=generator)
    noise = torch.randn(4, 2, 5, 8, generator=generator)
    # float32 values, used exactly in float64 for the reference
    points, prototypes = (prototypes[None, :, :5] + offset * noise).double(), prototypes.double()
    exact = prototype_block(points, prototypes, torch.full((2,), tau, dtype=torch.float64))
    relative = (exact.l_q - exact.l_ols - exact.variance).abs() / exact.l_q
    assert relative.max() < 1e-10
    single = prototype_block(points.float(), prototypes.float(), torch.full((2,), tau))
    # float32 limit: o_hat carries a rounding error of ~1e-7 * ||p||, against ||o - o_hat|| ~ offset
    relative = (single.l_q - single.l_ols - single.variance).abs() / single.l_q
    assert relative.max() < 1e-4
    torch.testing.assert_close(single.l_q.double(), exact.l_q, rtol=1e-4, atol=0)


def test_matches_direct_float64_reference():
    generator = torch.Generator().manual_seed(2)
    points = torch.randn(2, 3, 5, 4, generator=generator)
    prototypes = torch.randn(3, 6, 4, generator=generator)
    tau = torch.tensor([0.2, 1.0, 5.0])
    result = prototype_block(points, prototypes, tau)
    for got, expected in zip(result, direct_reference(points, prototypes, tau), strict=True):
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_hand_computed_one_dimensional_example():
    prototypes = torch.tensor([[[0.0], [2.0]]])
    midpoint = prototype_block(torch.tensor([[[[1.0]]]]), prototypes, torch.tensor([1.0]))
    torch.testing.assert_close(midpoint.assignments, torch.tensor([[[[0.5, 0.5]]]]))
    assert midpoint.output.item() == pytest.approx(1.0)
    assert midpoint.l_ols.item() == pytest.approx(0.0, abs=1e-7)
    assert midpoint.variance.item() == pytest.approx(1.0)
    assert midpoint.l_q.item() == pytest.approx(1.0)
    # o = 0.5, tau = 1: distances 0.25 and 2.25, q_0 = 1 / (1 + e^-2)
    skewed = prototype_block(torch.tensor([[[[0.5]]]]), prototypes, torch.tensor([1.0]))
    q0 = 1.0 / (1.0 + math.exp(-2.0))
    o_hat = 2.0 * (1 - q0)
    assert skewed.assignments[0, 0, 0, 0].item() == pytest.approx(q0, rel=1e-6)
    assert skewed.output.item() == pytest.approx(o_hat, rel=1e-6)
    assert skewed.l_q.item() == pytest.approx(q0 * 0.25 + (1 - q0) * 2.25, rel=1e-6)
    assert skewed.l_ols.item() == pytest.approx((0.5 - o_hat) ** 2, rel=1e-5)
    assert skewed.variance.item() == pytest.approx(q0 * o_hat**2 + (1 - q0) * (2 - o_hat) ** 2, rel=1e-6)


def test_assignments_become_one_hot_as_tau_approaches_tau_min():
    generator = torch.Generator().manual_seed(3)
    points = torch.randn(2, 1, 50, 8, generator=generator)
    prototypes = torch.randn(1, 10, 8, generator=generator)
    tau_min = 1e-3
    nearest = torch.cdist(points[:, 0].double(), prototypes[0].double()).argmin(-1)
    sharpness = []
    for rho in (2.0, 0.0, -3.0, -8.0, -30.0):
        tau = temperature_from_rho(torch.tensor([rho]), tau_min)
        result = prototype_block(points, prototypes, tau)
        sharpness.append(result.assignments.max(-1).values.mean().item())
    assert sharpness == sorted(sharpness)
    assert sharpness[-1] > 0.999
    assert torch.equal(result.assignments[:, 0].argmax(-1), nearest)
    # hard assignment: the output is the nearest prototype and V vanishes
    torch.testing.assert_close(result.output[:, 0], prototypes[0][nearest], atol=1e-4, rtol=0)
    assert result.variance.max() < 1e-3 * result.l_q.mean()


def test_temperature_parametrisation_and_its_inverse():
    rho = torch.tensor([-5.0, 0.0, 3.0])
    torch.testing.assert_close(temperature_from_rho(rho, 0.05), 0.05 + torch.log1p(torch.exp(rho)))
    for tau in (0.06, 1.0, 7.5):
        recovered = temperature_from_rho(torch.tensor(rho_for_temperature(tau, 0.05)), 0.05)
        assert recovered.item() == pytest.approx(tau, rel=1e-6)
    bank = PrototypeBank(num_prototypes=4, dim=3, tau_min=0.1, tau_init=2.0)
    assert bank.temperature().item() == pytest.approx(2.0, rel=1e-6)
    assert bank.temperature().item() > 0.1
    with pytest.raises(ValueError, match="tau"):
        rho_for_temperature(0.05, 0.05)


def test_gradients_reach_points_prototypes_and_temperature():
    generator = torch.Generator().manual_seed(4)
    points = torch.randn(2, 2, 5, 4, generator=generator, requires_grad=True)
    prototypes = torch.randn(2, 3, 4, generator=generator, requires_grad=True)
    rho = torch.zeros(2, requires_grad=True)
    result = prototype_block(points, prototypes, temperature_from_rho(rho, 0.05))
    (result.l_q.mean() + result.output.square().mean()).backward()
    for tensor in (points, prototypes, rho):
        assert torch.isfinite(tensor.grad).all() and tensor.grad.abs().sum() > 0


def test_min_pairwise_distance_by_hand():
    prototypes = torch.tensor([[[0.0, 0.0], [3.0, 4.0], [6.0, 8.0]], [[1.0, 1.0], [1.0, 2.0], [9.0, 9.0]]])
    torch.testing.assert_close(min_pairwise_distance(prototypes), torch.tensor([5.0, 1.0]))


def test_assignment_perplexity_counts_used_prototypes_on_real_tokens():
    uniform = torch.full((2, 1, 3, 4), 0.25)
    mask = torch.ones(2, 3)
    assert assignment_perplexity(uniform, mask).item() == pytest.approx(4.0, rel=1e-5)
    one_hot = torch.zeros(2, 1, 3, 4)
    one_hot[..., 2] = 1.0
    assert assignment_perplexity(one_hot, mask).item() == pytest.approx(1.0, rel=1e-5)
    # two real tokens on prototypes 0 and 1, a padding token on prototype 3 that must be ignored
    mixed = torch.zeros(1, 1, 3, 4)
    mixed[0, 0, 0, 0] = mixed[0, 0, 1, 1] = mixed[0, 0, 2, 3] = 1.0
    assert assignment_perplexity(mixed, torch.tensor([[1, 1, 0]])).item() == pytest.approx(2.0, rel=1e-5)


def test_float32_under_bfloat16_autocast():
    generator = torch.Generator().manual_seed(5)
    points = torch.randn(2, 2, 5, 8, generator=generator).bfloat16()
    prototypes = torch.randn(2, 4, 8, generator=generator).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        result = prototype_block(points, prototypes, torch.tensor([0.5, 2.0]))
    assert result.output.dtype == torch.bfloat16
    assert result.l_q.dtype == result.assignments.dtype == torch.float32
    reference = prototype_block(points.float(), prototypes.float(), torch.tensor([0.5, 2.0]))
    torch.testing.assert_close(result.l_q, reference.l_q)


@pytest.mark.parametrize(
    ("points_shape", "prototypes_shape", "tau_shape", "name"),
    [
        ((2, 5, 4), (2, 3, 4), (2,), "head_outputs"),
        ((2, 2, 5, 4), (3, 3, 4), (2,), "prototypes"),
        ((2, 2, 5, 4), (2, 3, 5), (2,), "prototypes"),
        ((2, 2, 5, 4), (2, 3, 4), (3,), "tau"),
    ],
)
def test_bad_shapes_name_the_argument(points_shape, prototypes_shape, tau_shape, name):
    with pytest.raises(ValueError, match=name):
        prototype_block(torch.zeros(points_shape), torch.zeros(prototypes_shape), torch.ones(tau_shape))

"""INCRT spectral gate on planted spectra: trackers against `eigh`, deflation, calibration, decisions."""

import math

import pytest
import torch

from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
from geoformers.models.ddcl_incrt.incrt import (
    build_gate,
    deflate,
    directional_matrix,
    exact_extreme_eigenpairs,
    head_directional_energy,
    interaction_matrix,
    mca_exin_step,
    oja_step,
    seeded_unit_vector,
    track_eigenvector,
)

DIM = 16


def planted_problem(pair_values, dim=DIM, seed=0):
    """C = X^T X / N and antisymmetric M_a whose A_sym has eigenvalues +-a for each a in `pair_values`.

    In an orthonormal basis v_1..v_d with C = sum c_i v_i v_i^T, an M_a coupling only v_i and v_j by mu
    gives A_sym the 2 x 2 block [[0, a], [a, 0]] with a = (c_i - c_j) mu / 2: eigenvalues +-a, eigenvectors
    (v_i +- v_j) / sqrt(2). X (N x d) is built so that X^T X / N equals C exactly.
    """
    generator = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))
    spectrum = torch.linspace(3.0, 0.5, dim, dtype=torch.float64)
    coupling = torch.zeros(dim, dim, dtype=torch.float64)
    top_vectors = []
    for pair, value in enumerate(pair_values):
        i, j = 2 * pair, 2 * pair + 1
        mu = 2 * value / (spectrum[i] - spectrum[j])
        coupling[i, j], coupling[j, i] = mu, -mu
        top_vectors.append((basis[:, i] + basis[:, j]) / math.sqrt(2))
    num_tokens = 64
    tokens, _ = torch.linalg.qr(torch.randn(num_tokens, dim, generator=generator, dtype=torch.float64))
    x = math.sqrt(num_tokens) * tokens @ torch.diag(spectrum.sqrt()) @ basis.T
    second_moment = x.T @ x / num_tokens
    directional = basis @ coupling @ basis.T
    return second_moment.float(), directional.float(), [v.float() for v in top_vectors]


def check(gate, second_moment, directional, head_energies, **cadence):
    """One gate check of one layer: what the model's `gate_check` does per layer."""
    return gate.decide(gate.observe(second_moment, directional, head_energies, **cadence))


def gate_config(**overrides):
    settings = {"hidden_size": DIM, "head_dim": 2, "gate_theta_w": 2.5}
    settings.update(overrides)
    return DDCLIncrtConfig(**settings)


def test_planted_problem_has_the_planted_spectrum():
    second_moment, directional, top_vectors = planted_problem([8.0, 6.0, 4.0])
    torch.testing.assert_close(directional, -directional.T)
    symmetric = interaction_matrix(second_moment, directional)
    eigenvalues = torch.linalg.eigvalsh(symmetric.double())
    planted = [-8.0, -6.0, -4.0, 8.0, 6.0, 4.0] + [0.0] * (DIM - 6)
    expected = torch.tensor(sorted(planted), dtype=torch.float64)
    torch.testing.assert_close(eigenvalues, expected, atol=1e-4, rtol=0)
    assert abs(float(torch.trace(symmetric))) < 1e-4  # A_sym is traceless: indefinite by construction
    torch.testing.assert_close(symmetric @ top_vectors[0], 8.0 * top_vectors[0], atol=1e-4, rtol=0)


def test_directional_matrix_matches_per_head_formula():
    generator = torch.Generator().manual_seed(1)
    query_weights = torch.randn(3, 4, DIM, generator=generator, dtype=torch.float64)
    key_weights = torch.randn(3, 4, DIM, generator=generator, dtype=torch.float64)
    expected = torch.zeros(DIM, DIM, dtype=torch.float64)
    for head in range(3):
        w_q, w_k = query_weights[head].T, key_weights[head].T  # W_Q^h: d x D, q = x W_Q^h
        expected += (w_q @ w_k.T - w_k @ w_q.T) / 2
    torch.testing.assert_close(directional_matrix(query_weights, key_weights), expected)


def test_head_energy_matches_dense_frobenius_norm():
    generator = torch.Generator().manual_seed(2)
    query_weights = torch.randn(3, 4, DIM, generator=generator, dtype=torch.float64)
    key_weights = torch.randn(3, 4, DIM, generator=generator, dtype=torch.float64)
    x = torch.randn(40, DIM, generator=generator, dtype=torch.float64)
    second_moment = x.T @ x / 40
    per_head = [directional_matrix(query_weights[h : h + 1], key_weights[h : h + 1]) for h in range(3)]
    expected = torch.stack([torch.linalg.matrix_norm(second_moment @ m) for m in per_head])
    torch.testing.assert_close(head_directional_energy(second_moment, query_weights, key_weights), expected)


def test_single_steps_by_hand():
    matrix = torch.diag(torch.tensor([2.0, -1.0]))
    vector = torch.tensor([0.6, 0.8])
    product = matrix @ vector  # [1.2, -0.8]
    oja = oja_step(vector, product, rate=0.5)
    expected = torch.tensor([0.6 + 0.6, 0.8 - 0.4])
    torch.testing.assert_close(oja, expected / expected.norm())
    # MCA EXIN: u - eta/(u.u) (A u - (u.A u / u.u) u), u.A u = 0.72 - 0.64 = 0.08
    mca = mca_exin_step(vector, product, rate=0.5)
    expected = vector - 0.5 * (product - 0.08 * vector)
    torch.testing.assert_close(mca, expected / expected.norm())


@pytest.mark.parametrize(
    "pair_values", [[8.0, 6.0, 4.0, 3.0, 1.0, 0.5, 0.3, 0.2], [5.0, 4.5, 1.0]], ids=["wide", "close"]
)
def test_oja_and_mca_exin_agree_with_eigh(pair_values):
    second_moment, directional, _ = planted_problem(pair_values)
    symmetric = interaction_matrix(second_moment, directional)
    exact = exact_extreme_eigenpairs(symmetric)
    start = seeded_unit_vector(DIM, seed=7)
    top = track_eigenvector(symmetric, start, step=0.9, max_steps=5000, tolerance=1e-4)
    minor = track_eigenvector(symmetric, start, step=0.9, max_steps=5000, tolerance=1e-4, minor=True)
    assert abs(float(top.vector @ exact.top)) >= 0.99
    assert top.eigenvalue == pytest.approx(exact.lambda_max, rel=0.01)
    assert abs(float(minor.vector @ exact.minor)) >= 0.99
    assert minor.eigenvalue == pytest.approx(exact.lambda_min, rel=0.01)
    assert top.residual <= 1e-4 and minor.residual <= 1e-4


def test_oja_finds_the_largest_signed_eigenvalue_when_the_negative_one_dominates():
    """|lambda_min| > lambda_max: plain power iteration would lock onto the negative end."""
    generator = torch.Generator().manual_seed(3)
    basis, _ = torch.linalg.qr(torch.randn(DIM, DIM, generator=generator, dtype=torch.float64))
    eigenvalues = torch.linspace(-10.0, 3.0, DIM, dtype=torch.float64)
    symmetric = (basis @ torch.diag(eigenvalues) @ basis.T).float()
    top = track_eigenvector(symmetric, seeded_unit_vector(DIM, 0), step=0.9, max_steps=5000, tolerance=1e-5)
    assert top.eigenvalue == pytest.approx(3.0, rel=0.01)
    assert abs(float(top.vector.double() @ basis[:, -1])) >= 0.99


def test_deflation_removes_the_captured_eigenvalue():
    second_moment, directional, top_vectors = planted_problem([8.0, 6.0, 4.0])
    symmetric = interaction_matrix(second_moment, directional)
    residual = deflate(symmetric, top_vectors[0][None])
    eigenvalues = torch.linalg.eigvalsh(residual.double())
    assert eigenvalues[-1].item() == pytest.approx(6.0, abs=1e-4)
    assert torch.all((eigenvalues - 8.0).abs() > 1.0)
    assert (residual @ top_vectors[0]).norm() < 1e-4
    # everything orthogonal to the captured direction is untouched
    torch.testing.assert_close(residual @ top_vectors[1], symmetric @ top_vectors[1], atol=1e-4, rtol=0)


@pytest.mark.parametrize(("theta_w", "expected_heads"), [(5.0, 2), (2.5, 4)])
def test_repeated_check_and_grow_adds_exactly_k_heads_in_decreasing_order(theta_w, expected_heads):
    pair_values = [8.0, 6.0, 4.0, 3.0, 1.0, 0.5, 0.3, 0.2]
    second_moment, directional, top_vectors = planted_problem(pair_values)
    gate = build_gate(gate_config(gate_theta_w=theta_w), layer_index=0)
    num_heads, grown = 1, []
    for _ in range(30):
        decision = check(gate, second_moment, directional, torch.ones(num_heads))
        if decision.action == "grow":
            grown.append((decision.lambda_max, decision.direction))
            gate.record_growth(num_heads, decision.direction)
            num_heads += 1
        elif decision.action == "stop":
            break
    assert decision.action == "stop"
    assert len(grown) == expected_heads
    eigenvalues = [value for value, _ in grown]
    assert eigenvalues == sorted(eigenvalues, reverse=True)
    expected = zip(pair_values[:expected_heads], top_vectors[:expected_heads], strict=True)
    for (value, direction), (planted_value, planted_vector) in zip(grown, expected, strict=True):
        assert value == pytest.approx(planted_value, rel=0.02)
        assert abs(float(direction @ planted_vector)) >= 0.98
    assert decision.lambda_max <= theta_w
    assert int(gate.basis_size) == expected_heads


def test_exact_eigh_path_gives_the_planted_eigenvalues():
    second_moment, directional, top_vectors = planted_problem([8.0, 6.0, 4.0])
    gate = build_gate(gate_config(gate_use_exact_eigh=True), layer_index=0)
    decision = check(gate, second_moment, directional, torch.ones(1))
    assert decision.action == "grow"
    assert decision.lambda_max == pytest.approx(8.0, rel=1e-5)
    assert decision.lambda_min == pytest.approx(-8.0, rel=1e-5)
    assert abs(float(decision.direction @ top_vectors[0])) == pytest.approx(1.0, abs=1e-5)


def test_theta_w_is_calibrated_from_the_median_residual_norm():
    config = gate_config(
        gate_theta_w=None, gate_threshold="calibrated", gate_calibration_checks=3, gate_calibration_factor=0.1
    )
    gate = build_gate(config, 0)
    assert not bool(gate.calibrated)
    norms = []
    for scale in (1.0, 3.0, 2.0):
        second_moment, directional, _ = planted_problem([8.0 * scale, 6.0 * scale])
        residual = interaction_matrix(second_moment, directional)
        norms.append(float(torch.linalg.matrix_norm(residual)))
        decision = check(gate, second_moment, directional, torch.ones(1))
    assert decision.theta_w == pytest.approx(0.1 * sorted(norms)[1], rel=1e-6)
    assert bool(gate.calibrated)
    assert decision.action in ("grow", "pending")  # the third check already decides
    fresh = build_gate(
        gate_config(gate_theta_w=None, gate_threshold="calibrated", gate_calibration_checks=2), 0
    )
    assert check(fresh, second_moment, directional, torch.ones(1)).action == "calibrating"


def test_pruning_needs_patience_and_never_removes_every_head():
    second_moment, directional, _ = planted_problem([8.0])
    gate = build_gate(gate_config(gate_theta_w=1.0, gate_prune_factor=0.5, gate_prune_patience=2), 0)
    energies = torch.tensor([2.0, 0.1, 0.2])  # phi_g = 0.5: heads 1 and 2 are below
    assert check(gate, second_moment, directional, energies).prune == []
    assert check(gate, second_moment, directional, energies).prune == [2, 1]
    # a check above the threshold resets the count
    check(gate, second_moment, directional, torch.tensor([2.0, 0.1, 0.9]))
    assert check(gate, second_moment, directional, energies).prune == [1]
    # all heads below: the strongest one stays
    weak = torch.tensor([0.1, 0.3, 0.2])
    check(gate, second_moment, directional, weak)
    assert check(gate, second_moment, directional, weak).prune == [2, 0]


def test_growth_and_pruning_bookkeeping_of_the_deflation_basis():
    gate = build_gate(gate_config(), 0)
    e = torch.eye(DIM)
    gate.record_growth(1, e[0])
    gate.record_growth(2, None)  # grown without a direction: no basis row
    gate.record_growth(3, e[0] + e[1])  # Gram-Schmidt keeps only the new part, e_1
    gate.record_growth(4, 2 * e[0])  # already inside the span: no row
    assert int(gate.basis_size) == 2
    torch.testing.assert_close(gate.active_basis(), e[:2])
    assert gate.basis_owner[:2].tolist() == [1, 3]
    gate.prune_counters[:5] = torch.tensor([0, 1, 2, 3, 4])
    gate.record_pruning(1)
    torch.testing.assert_close(gate.active_basis(), e[1:2])
    assert gate.basis_owner[:1].tolist() == [2]  # head 3 became head 2
    assert gate.prune_counters[:5].tolist() == [0, 2, 3, 4, 0]


def test_full_when_the_layer_has_max_heads():
    second_moment, directional, _ = planted_problem([8.0])
    gate = build_gate(gate_config(max_heads=2), 0)
    assert check(gate, second_moment, directional, torch.ones(2)).action == "full"


def test_no_signal_means_stop():
    gate = build_gate(gate_config(), 0)
    decision = check(gate, torch.eye(DIM), torch.zeros(DIM, DIM), torch.ones(1))
    assert decision.action == "stop" and decision.lambda_max == 0.0 and decision.residual_norm == 0.0


def grow_until_stop(gate, second_moment, directional, max_checks=30):
    """Check and grow (a planted problem, heads with unit energy) until the gate stops; the grown lambdas."""
    grown = []
    for _ in range(max_checks):
        decision = check(gate, second_moment, directional, torch.ones(1 + len(grown)))
        if decision.action == "grow":
            gate.record_growth(1 + len(grown), decision.direction)
            grown.append(decision.lambda_max)
        elif decision.action == "stop":
            return grown, decision
    raise AssertionError("the gate did not stop")


@pytest.mark.parametrize(("factor", "expected"), [(0.2, [8.0, 6.0, 4.0]), (0.3, [8.0, 6.0])])
@pytest.mark.parametrize("scale", [1.0, 0.04, 30.0])
def test_relative_threshold_grows_the_eigenvalues_above_a_fraction_of_the_frobenius_norm(
    factor, expected, scale
):
    pair_values = [8.0, 6.0, 4.0, 3.0, 1.0, 0.5, 0.3, 0.2]
    second_moment, directional, _ = planted_problem(pair_values)
    # A_sym has eigenvalues +-a: ||A_sym||_F = sqrt(2 sum a^2) = 15.90; theta_w = 3.18 (0.2) or 4.77 (0.3).
    frobenius = math.sqrt(2 * sum(a * a for a in pair_values))
    gate = build_gate(
        gate_config(gate_theta_w=None, gate_threshold="relative", gate_calibration_factor=factor), 0
    )
    assert bool(gate.calibrated)  # no calibration checks: the first check already decides
    # C -> scale C and M_a -> scale M_a (inputs and weights drifting in training) scale A_sym by scale^2
    grown, decision = grow_until_stop(gate, second_moment * scale, directional * scale)
    assert grown == pytest.approx([value * scale * scale for value in expected], rel=0.02)
    assert decision.theta_w == pytest.approx(factor * frobenius * scale * scale, rel=1e-5)
    assert float(gate.theta_w) == pytest.approx(decision.theta_w)


def test_calibrated_threshold_cascades_when_the_spectrum_grows_and_relative_does_not():
    pair_values = [8.0, 6.0, 4.0, 3.0, 1.0, 0.5, 0.3, 0.2]
    second_moment, directional, _ = planted_problem(pair_values)
    settings = {"gate_theta_w": None, "gate_calibration_factor": 0.2, "gate_calibration_checks": 1}
    calibrated = build_gate(gate_config(**settings, gate_threshold="calibrated"), 0)
    relative = build_gate(gate_config(**settings, gate_threshold="relative"), 0)
    # calibrated on the first check: theta_w = 0.2 ||A_sym||_F = 0.2 sqrt(2 sum a^2) = 3.18, then fixed
    first = check(calibrated, second_moment, directional, torch.ones(1))
    assert first.theta_w == pytest.approx(3.18, abs=0.01)
    # training makes W_Q W_K^T ten times larger: every eigenvalue above 3.18 gets a head (80 ... 5, not 3)
    grown, _ = grow_until_stop(calibrated, second_moment, 10 * directional)
    assert grown == pytest.approx([80.0, 60.0, 40.0, 30.0, 10.0, 5.0], rel=0.02)
    # the relative threshold moves with the scale (31.8) and keeps the same three heads
    grown, _ = grow_until_stop(relative, second_moment, 10 * directional)
    assert grown == pytest.approx([80.0, 60.0, 40.0], rel=0.02)


@pytest.mark.parametrize(
    ("settings", "message", "error"),
    [
        ({"gate_threshold": "adaptive"}, "`gate_threshold`: .* expected one of", TypeError),
        ({"gate_rule": "both"}, "`gate_rule`: .* expected one of", TypeError),
        ({"gate_phi_w_factor": math.nan}, "`gate_phi_w_factor`: Value must be", ValueError),
        ({"gate_dwell_kappa": 0.0}, "`gate_dwell_kappa`: Value must be greater than 0.0", ValueError),
        ({"gate_dwell_eps": 1.0}, "`gate_dwell_eps`: Value must be .* smaller than 1.0", ValueError),
        ({"gate_use_dwell": 1}, "`gate_use_dwell`: .* expected bool", TypeError),
        ({"gate_use_lambda_min_test": "yes"}, "`gate_use_lambda_min_test`: .* expected bool", TypeError),
        ({"gate_couple_trackers": None}, "`gate_couple_trackers`: .* expected bool", TypeError),
    ],
)
def test_bad_gate_threshold_settings_are_rejected(settings, message, error):
    with pytest.raises(error, match=message):
        DDCLIncrtConfig(hidden_size=DIM, head_dim=2, **settings)


def test_defaults_are_the_relative_threshold_and_a_fixed_theta_w_overrides_it():
    config = DDCLIncrtConfig(hidden_size=DIM, head_dim=2)
    assert (config.gate_threshold, config.gate_rule, config.gate_theta_w) == ("relative", "max_only", None)
    second_moment, directional, _ = planted_problem([8.0, 6.0, 4.0])
    fixed = build_gate(DDCLIncrtConfig(hidden_size=DIM, head_dim=2, gate_theta_w=7.0), 0)
    decision = check(fixed, second_moment, directional, torch.ones(1))
    assert (decision.action, decision.theta_w) == ("grow", 7.0)  # not 0.1 ||A_sym||_F = 1.70
    assert check(fixed, second_moment, directional * 0.5, torch.ones(1)).theta_w == 7.0

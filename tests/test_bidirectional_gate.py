"""The bidirectional INCRT rule (docs/growth_gate.md) on planted spectra: dwell formula, coupled trackers,
spectral gaps against `eigvalsh`, growth order, dwell, stop, each ablation flag, pruning."""

import math

import pytest
import torch
from test_incrt_gate import DIM, check, planted_problem

from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
from geoformers.models.ddcl_incrt.incrt import (
    bidirectional_action,
    build_gate,
    coupled_mca_step,
    coupled_oja_step,
    coupling_weight,
    dwell_checks,
    dwell_iterations,
    exact_spectral_gaps,
    interaction_matrix,
    seeded_unit_vector,
    spectral_radius_bound,
    track_coupled_pair,
    tracked_spectral_gaps,
)


def bidirectional_config(**overrides):
    settings = {"hidden_size": DIM, "head_dim": 2, "gate_theta_w": 2.5, "gate_rule": "bidirectional"}
    settings.update(overrides)
    return DDCLIncrtConfig(**settings)


def planted_symmetric(eigenvalues, seed=0):
    """Q diag(eigenvalues) Q^T with a random orthogonal Q (float64), and Q."""
    generator = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(
        torch.randn(len(eigenvalues), len(eigenvalues), generator=generator, dtype=torch.float64)
    )
    return basis @ torch.diag(torch.tensor(eigenvalues, dtype=torch.float64)) @ basis.T, basis


def expected_dwell(residual, *, eta=0.9, kappa=2.0, eps=0.05, per_check=200):
    """Hand formula: ceil(ceil(kappa / (eta (gap / b)^2) ln(1 / eps)) / per_check), exact gap and b."""
    eigenvalues = torch.linalg.eigvalsh(residual.double())
    bound = float(torch.linalg.matrix_norm(residual.double() @ residual.double()).sqrt())
    gap = float(eigenvalues[-1] - eigenvalues[-2]) / bound
    iterations = math.ceil(kappa / (eta * gap * gap) * math.log(1 / eps))
    return max(1, math.ceil(iterations / per_check))


def test_dwell_matches_the_notebook_formula_by_hand():
    # 2 / (0.9 * 0.1^2) * ln 20 = 665.73 -> 666 iterations -> 4 checks of 200
    assert dwell_iterations(0.9, 0.1, kappa_t=2.0, eps=0.05) == 666
    assert dwell_checks(0.9, 0.1, kappa_t=2.0, eps=0.05, iterations_per_check=200) == 4
    assert dwell_checks(0.9, 1.0, kappa_t=2.0, eps=0.05, iterations_per_check=200) == 1  # 7 iterations
    assert dwell_iterations(0.9, 0.0, kappa_t=2.0, eps=0.05) == 10000  # the notebook's degenerate gap
    assert coupling_weight(0.3, 0.1) == pytest.approx(0.75) and coupling_weight(0.0, 0.0) == 0.5


def test_coupled_steps_fix_eigenvectors_and_keep_the_pair_orthogonal():
    matrix, basis = planted_symmetric([5.0, 2.0, 1.0, 0.0, -1.0, -4.0])
    top, bottom = basis[:, 0], basis[:, -1]
    # at an eigenvector pair the coupling u+^T A u- is 0 and both steps leave the pair in place
    torch.testing.assert_close(coupled_oja_step(top, bottom, matrix, 0.1, 0.7), top)
    torch.testing.assert_close(coupled_mca_step(bottom, top, matrix, 0.1, 0.7), bottom)
    u_plus, u_minus = seeded_unit_vector(6, 0).double(), seeded_unit_vector(6, 1).double()
    u_plus = u_plus / u_plus.norm()  # unit in float64 (the seeded vector is unit in float32)
    updated = coupled_mca_step(u_minus, u_plus, matrix, 0.1, 0.7)
    assert abs(float(updated @ u_plus)) < 1e-12 and float(updated.norm()) == pytest.approx(1.0)


def test_coupled_pair_tracks_the_extreme_eigenpairs_of_an_indefinite_matrix():
    matrix, basis = planted_symmetric([5.0, 2.0, 1.0, 0.0, -1.0, -4.0])
    bound = float(spectral_radius_bound(matrix))
    pair = track_coupled_pair(
        matrix,
        seeded_unit_vector(6, 0).double(),
        seeded_unit_vector(6, 1).double(),
        rates=(0.9 / bound, 0.9 / bound),
        gamma=0.5,
        max_steps=2000,
        tolerance=1e-6,
        floor=0.0,
    )
    assert pair.lambda_max == pytest.approx(5.0, abs=1e-9)
    assert pair.lambda_min == pytest.approx(-4.0, abs=1e-9)
    assert abs(float(pair.top @ basis[:, 0])) == pytest.approx(1.0, abs=1e-9)
    assert abs(float(pair.minor @ basis[:, -1])) == pytest.approx(1.0, abs=1e-9)
    assert max(pair.top_residual, pair.minor_residual) <= 1e-6 and pair.steps < 2000


def test_tracked_spectral_gaps_agree_with_eigvalsh():
    matrix, _ = planted_symmetric([6.0, 4.0, 1.0, 0.5, -0.5, -2.0, -3.5, -5.0])
    bound = float(spectral_radius_bound(matrix))
    exact = exact_spectral_gaps(matrix, bound)
    assert exact.plus == pytest.approx(2.0 / bound) and exact.minus == pytest.approx(1.5 / bound)
    rates = (0.9 / bound, 0.9 / bound)
    pair = track_coupled_pair(
        matrix,
        seeded_unit_vector(8, 0).double(),
        seeded_unit_vector(8, 1).double(),
        rates=rates,
        gamma=0.5,
        max_steps=2000,
        tolerance=1e-8,
        floor=0.0,
    )
    starts = (seeded_unit_vector(8, 2).double(), seeded_unit_vector(8, 3).double())
    tracked = tracked_spectral_gaps(matrix, pair, starts, bound=bound, rates=rates, max_steps=400)
    assert tracked.plus == pytest.approx(exact.plus, rel=1e-3)
    assert tracked.minus == pytest.approx(exact.minus, rel=1e-3)


@pytest.mark.parametrize(
    ("lambda_max", "lambda_min", "use_lambda_min", "in_dwell", "full", "expected"),
    [
        (3.0, -3.0, True, False, False, "grow"),
        (2.0, -3.0, True, False, False, "stop"),
        (3.0, 1.5, True, False, False, "stop"),
        (3.0, 1.5, False, False, False, "grow"),
        (3.0, -3.0, True, True, False, "dwell"),
        (2.0, -3.0, True, True, False, "stop"),
        (3.0, -3.0, True, False, True, "full"),
    ],
)
def test_bidirectional_action_table(lambda_max, lambda_min, use_lambda_min, in_dwell, full, expected):
    """theta_w = 2.5, phi_w = 1.25."""
    action = bidirectional_action(
        lambda_max,
        lambda_min,
        theta_w=2.5,
        phi_w=1.25,
        use_lambda_min=use_lambda_min,
        in_dwell=in_dwell,
        full=full,
    )
    assert action == expected


def run_checks(gate, second_moment, directional, checks):
    """`checks` gate checks, growing a head (unit energy) at every "grow"; the (action, lambda_max) list."""
    record = []
    heads = 1
    for _ in range(checks):
        decision = check(gate, second_moment, directional, torch.ones(heads))
        if decision.action == "grow":
            gate.record_growth(heads, decision.direction)
            heads += 1
        record.append((decision.action, decision.lambda_max, decision.direction))
    return record


@pytest.mark.parametrize("exact", [True, False])
def test_grows_the_planted_directions_in_decreasing_order_then_stops(exact):
    second_moment, directional, top_vectors = planted_problem([8.0, 6.0, 4.0, 1.0])
    gate = build_gate(bidirectional_config(gate_use_exact_eigh=exact), 0)
    record = run_checks(gate, second_moment, directional, 8)
    grown = [(value, direction) for action, value, direction in record if action == "grow"]
    accuracy = 1e-4 if exact else 0.02  # the trackers stop at a relative residual of 0.02
    assert [value for value, _ in grown] == pytest.approx([8.0, 6.0, 4.0], rel=accuracy)
    for (_, direction), planted in zip(grown, top_vectors, strict=False):
        assert abs(float(direction @ planted)) == pytest.approx(1.0, abs=accuracy)
    actions = [action for action, _, _ in record]
    assert actions[-1] == "stop" and actions.count("grow") == 3  # 1 < theta_w = 2.5: residual exhausted
    assert "dwell" not in actions  # well-separated eigenvalues: T_d is one check


def test_no_growth_within_the_dwell_of_the_last_one():
    """Eigenvalues 8, 5, 4.8: after the head along 8 the residual's top gap is 0.2, so T_d is long."""
    second_moment, directional, _ = planted_problem([8.0, 5.0, 4.8])
    config = bidirectional_config(gate_use_exact_eigh=True, gate_dwell_kappa=0.1)
    gate = build_gate(config, 0)
    first = check(gate, second_moment, directional, torch.ones(1))
    assert first.action == "grow" and first.lambda_max == pytest.approx(8.0, rel=1e-4)
    gate.record_growth(1, first.direction)
    basis = gate.active_basis()
    projector = torch.eye(DIM) - basis.T @ basis
    residual = projector @ interaction_matrix(second_moment, directional) @ projector
    dwell = expected_dwell(residual, kappa=0.1)
    assert 3 <= dwell <= 8, dwell  # the test needs a dwell of a few checks
    actions = [action for action, _, _ in run_checks(gate, second_moment, directional, dwell)]
    assert actions == ["dwell"] * (dwell - 1) + ["grow"]  # checks 1 .. T_d - 1 after the growth wait
    expected_gap = 0.2 / float(spectral_radius_bound(residual))
    assert float(gate.spectral_gaps[0]) == pytest.approx(expected_gap, rel=1e-3)
    # without the dwell the same gate grows at consecutive checks
    ablated = build_gate(
        bidirectional_config(gate_use_exact_eigh=True, gate_dwell_kappa=0.1, gate_use_dwell=False), 0
    )
    actions = [action for action, _, _ in run_checks(ablated, second_moment, directional, 4)]
    assert actions == ["grow", "grow", "grow", "stop"]


def test_max_only_ignores_the_dwell_state_and_keeps_it_out_of_checkpoints():
    second_moment, directional, _ = planted_problem([8.0, 5.0, 4.8])
    max_only = build_gate(
        bidirectional_config(gate_rule="max_only", gate_use_exact_eigh=True, gate_dwell_kappa=0.1), 0
    )
    actions = [action for action, _, _ in run_checks(max_only, second_moment, directional, 4)]
    assert actions == ["grow", "grow", "grow", "stop"]
    assert "last_growth_check" not in max_only.state_dict() and "spectral_gaps" not in max_only.state_dict()
    bidirectional = build_gate(bidirectional_config(), 0)
    assert {"last_growth_check", "spectral_gaps"} <= set(bidirectional.state_dict())


@pytest.mark.parametrize(("use_lambda_min", "expected"), [(True, "stop"), (False, "grow")])
def test_the_lambda_min_test_stops_growth_when_no_direction_lies_below_phi_w(use_lambda_min, expected):
    """lambda_min(A_sym) = -8; phi_w = -4 theta_w = -10 puts it above phi_w."""
    second_moment, directional, _ = planted_problem([8.0, 6.0])
    config = bidirectional_config(
        gate_use_exact_eigh=True, gate_phi_w_factor=-4.0, gate_use_lambda_min_test=use_lambda_min
    )
    decision = check(build_gate(config, 0), second_moment, directional, torch.ones(1))
    assert decision.lambda_min == pytest.approx(-8.0, rel=1e-4) and decision.action == expected
    # phi_w = -2 theta_w = -5: lambda_min = -8 lies below it, both variants grow
    config = bidirectional_config(gate_use_exact_eigh=True, gate_phi_w_factor=-2.0)
    assert check(build_gate(config, 0), second_moment, directional, torch.ones(1)).action == "grow"


@pytest.mark.parametrize("coupled", [True, False])
def test_coupling_keeps_the_trackers_orthogonal_and_converges_to_the_same_pair(coupled):
    second_moment, directional, top_vectors = planted_problem([8.0, 6.0])
    few = build_gate(bidirectional_config(gate_couple_trackers=coupled), 0)
    check(few, second_moment, directional, torch.ones(1), tracker_steps=3)
    overlap = abs(float(few.u_plus @ few.u_minus))
    assert (overlap < 1e-6) if coupled else (overlap > 1e-4), overlap  # the coupled MCA step orthogonalises
    gate = build_gate(bidirectional_config(gate_couple_trackers=coupled), 0)
    decision = check(gate, second_moment, directional, torch.ones(1))
    assert decision.action == "grow" and decision.lambda_max == pytest.approx(8.0, rel=0.05)
    assert decision.lambda_min == pytest.approx(-8.0, rel=0.05)
    assert abs(float(decision.direction @ top_vectors[0])) == pytest.approx(1.0, abs=0.05)


def test_author_pruning_needs_t_prune_consecutive_checks_below_phi_g():
    """phi_g = 0.01 theta_w = 0.025; T_prune = 4 here (100 in the notebook): a check above resets it."""
    second_moment, directional, _ = planted_problem([8.0])
    gate = build_gate(bidirectional_config(gate_prune_factor=0.01, gate_prune_patience=4), 0)
    low, high = torch.tensor([2.0, 0.01]), torch.tensor([2.0, 0.03])
    prunes = [
        check(gate, second_moment, directional, energies).prune
        for energies in (low, low, low, high, low, low, low, low)
    ]
    assert prunes == [[], [], [], [], [], [], [], [1]]


def test_bidirectional_settings_are_validated():
    with pytest.raises(TypeError, match="`gate_rule`: .* expected one of"):
        bidirectional_config(gate_rule="min_max")
    with pytest.raises(ValueError, match="`gate_dwell_eps`: Value must be greater than 0.0"):
        bidirectional_config(gate_dwell_eps=0.0)
    with pytest.raises(TypeError, match="`gate_couple_trackers`: .* expected bool"):
        bidirectional_config(gate_couple_trackers="no")

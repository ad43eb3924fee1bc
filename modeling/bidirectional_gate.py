"""The bidirectional INCRT growth rule (docs/growth_gate.md, "The bidirectional rule"): both trackers decide.

On the deflated residual A_res of one layer, with u+ / u- tracking its top / bottom eigenvectors:

    grow   when lambda_max(A_res) > theta_w and lambda_min(A_res) < phi_w (phi_w = phi_w_factor * theta_w)
           and at least T_d checks after the layer's last growth (the dwell)
    T_d    = ceil(kappa_T / (eta * Delta+^2) * log(1 / eps))  tracker iterations; Delta+ = lambda_1 - lambda_2
    gamma* = Delta+ / (Delta+ + Delta-)                        Delta- = lambda_{d-1} - lambda_d
    u+    <- normalize(u+ + eta+ [A u+ - (1 - gamma*) c u-])   c = u+^T A u-
    u-    <- orthogonalize(normalize(u- - eta- (A u- - rho- u-) + eta- gamma* (1 - gamma*) c u+), u+)

Everything here is dimensionless in the spectral-radius bound b of A_res (`spectral_radius_bound`): the
trackers step by eta = step / b, so eta * Delta^2 in T_d is read as step * (Delta / b)^2 and the gaps are
stored as Delta / b. Each gate check runs up to `gate_tracker_steps` tracker iterations, so T_d iterations
are ceil(T_d / gate_tracker_steps) checks (`dwell_checks`). Pure tensor code; `IncrtGate` holds the state.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

# Buffers of `IncrtGate` that only this rule reads: saved in checkpoints only when gate_rule="bidirectional".
DWELL_STATE = ("last_growth_check", "spectral_gaps")
NO_GROWTH_YET = -1  # `last_growth_check` of a layer that has not grown: no dwell applies
# The author's notebook: a gap below 1e-8 (a degenerate top eigenvalue) gives a dwell of 10000 iterations.
DEGENERATE_GAP, DEGENERATE_DWELL = 1e-8, 10000
NORM_FLOOR = 1e-12  # guards the normalisations and divisions below


def dwell_iterations(eta: float, gap: float, *, kappa_t: float, eps: float) -> int:
    """T_d = ceil(kappa_T / (eta * Delta^2) * log(1 / eps)): tracker iterations until u+ is eps-accurate on a
    residual whose top gap is Delta (both dimensionless: eta = step, Delta = gap / b)."""
    if gap < DEGENERATE_GAP:
        return DEGENERATE_DWELL
    return math.ceil(kappa_t / (eta * gap * gap) * math.log(1.0 / eps))


def dwell_checks(eta: float, gap: float, *, kappa_t: float, eps: float, iterations_per_check: int) -> int:
    """T_d in gate checks (at least 1: the check right after a growth is the earliest next one)."""
    iterations = dwell_iterations(eta, gap, kappa_t=kappa_t, eps=eps)
    return max(1, math.ceil(iterations / iterations_per_check))


def coupling_weight(gap_plus: float, gap_minus: float) -> float:
    """gamma* = Delta+ / (Delta+ + Delta-); 1/2 before any gap is known (both 0)."""
    total = gap_plus + gap_minus
    return 0.5 if total < NORM_FLOOR else gap_plus / total


def _unit(vector: torch.Tensor) -> torch.Tensor:
    return vector / vector.norm().clamp_min(NORM_FLOOR)


def _orthogonal_to(vector: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
    return _unit(vector - (vector @ unit) * unit)


def coupled_oja_step(u_plus: torch.Tensor, u_minus: torch.Tensor, matrix: torch.Tensor, rate: float,
                     gamma: float) -> torch.Tensor:
    """Oja's step for the unit u+ (as `incrt.oja_step`: u + eta A u, normalised) with the author's coupling
    term -eta (1 - gamma*) (u+^T A u-) u-."""
    coupling = float(u_plus @ (matrix @ u_minus))
    return _unit(u_plus + rate * (matrix @ u_plus - (1.0 - gamma) * coupling * u_minus))


def coupled_mca_step(u_minus: torch.Tensor, u_plus: torch.Tensor, matrix: torch.Tensor, rate: float,
                     gamma: float) -> torch.Tensor:
    """MCA EXIN's step for the unit u- (as `incrt.mca_exin_step`: u - eta (A u - rho u)) plus the author's
    coupling term eta gamma* (1 - gamma*) (u+^T A u-) u+, normalised, then made orthogonal to u+."""
    product = matrix @ u_minus
    rayleigh = float(u_minus @ product)
    coupling = float(u_plus @ product)
    updated = u_minus - rate * (product - rayleigh * u_minus - gamma * (1.0 - gamma) * coupling * u_plus)
    return _orthogonal_to(_unit(updated), u_plus)


class TrackedPair(NamedTuple):
    """u+ and u- after `track_coupled_pair`, their Rayleigh quotients and relative residuals."""

    top: torch.Tensor
    lambda_max: float
    top_residual: float
    minor: torch.Tensor
    lambda_min: float
    minor_residual: float
    steps: int


def _rayleigh_and_residual(vector: torch.Tensor, matrix: torch.Tensor, floor: float) -> tuple[float, float]:
    product = matrix @ vector
    rayleigh = float(vector @ product)
    return rayleigh, float((product - rayleigh * vector).norm()) / max(abs(rayleigh), floor, NORM_FLOOR)


def track_coupled_pair(matrix: torch.Tensor, u_plus: torch.Tensor, u_minus: torch.Tensor, *, rates: tuple,
                       gamma: float, max_steps: int, tolerance: float, floor: float) -> TrackedPair:
    """Joint warm-started iterations of `coupled_oja_step` and `coupled_mca_step` (rates = (eta+, eta-))
    until both relative residuals ||A u - rho u|| / max(|rho|, floor) are <= tolerance or `max_steps`."""
    u_plus, u_minus = _unit(u_plus), _orthogonal_to(u_minus, _unit(u_plus))
    steps = 0
    while True:
        top = _rayleigh_and_residual(u_plus, matrix, floor)
        minor = _rayleigh_and_residual(u_minus, matrix, floor)
        if max(top[1], minor[1]) <= tolerance or steps == max_steps:
            return TrackedPair(u_plus, *top, u_minus, *minor, steps)
        u_plus = coupled_oja_step(u_plus, u_minus, matrix, rates[0], gamma)
        u_minus = coupled_mca_step(u_minus, u_plus, matrix, rates[1], gamma)  # against the new u+
        steps += 1


class SpectralGaps(NamedTuple):
    plus: float  # (lambda_1 - lambda_2) / b
    minus: float  # (lambda_{d-1} - lambda_d) / b


def next_extreme_eigenvalue(matrix: torch.Tensor, found: torch.Tensor, start: torch.Tensor, *, minor: bool,
                            rate: float, max_steps: int) -> float:
    """lambda_2 (or lambda_{d-1} with `minor`): the top (bottom) Rayleigh quotient of A on the complement of
    the unit eigenvector estimate `found`, by power steps u +- eta A u kept orthogonal to it, `max_steps`
    of them from `start` (a gap estimate, not a decision)."""
    sign = -1.0 if minor else 1.0
    vector = _orthogonal_to(start, found)
    for _ in range(max_steps):
        vector = _orthogonal_to(vector + sign * rate * (matrix @ vector), found)
    return float(vector @ (matrix @ vector))


def tracked_spectral_gaps(matrix: torch.Tensor, pair: TrackedPair, starts: tuple, *, bound: float,
                          rates: tuple, max_steps: int) -> SpectralGaps:
    """Delta+ / b and Delta- / b from the trackers' Rayleigh quotients (lambda_max, lambda_min) and one more
    tracker each for lambda_2 and lambda_{d-1} (`next_extreme_eigenvalue`); clamped at 0."""
    second = next_extreme_eigenvalue(matrix, pair.top, starts[0], minor=False, rate=rates[0],
                                     max_steps=max_steps)
    penultimate = next_extreme_eigenvalue(matrix, pair.minor, starts[1], minor=True, rate=rates[1],
                                          max_steps=max_steps)
    scale = max(bound, NORM_FLOOR)
    return SpectralGaps(max(pair.lambda_max - second, 0.0) / scale,
                        max(penultimate - pair.lambda_min, 0.0) / scale)


def exact_spectral_gaps(matrix: torch.Tensor, bound: float) -> SpectralGaps:
    """Reference for `tracked_spectral_gaps`: the gaps of `eigvalsh` in float64, divided by b."""
    eigenvalues = torch.linalg.eigvalsh(matrix.double())
    if eigenvalues.shape[0] < 2:
        return SpectralGaps(0.0, 0.0)
    scale = max(bound, NORM_FLOOR)
    return SpectralGaps(float(eigenvalues[-1] - eigenvalues[-2]) / scale,
                        float(eigenvalues[1] - eigenvalues[0]) / scale)


def bidirectional_action(lambda_max: float, lambda_min: float, *, theta_w: float, phi_w: float,
                         use_lambda_min: bool, in_dwell: bool, full: bool) -> str:
    """The rule's verdict on converged trackers: "grow", "dwell" (would grow, but within T_d checks of the
    last growth: check again), "full" (would grow at max_heads) or "stop" (lambda_max <= theta_w, or
    lambda_min >= phi_w: no negative direction left for a head to pair with)."""
    if lambda_max <= theta_w or (use_lambda_min and lambda_min >= phi_w):
        return "stop"
    if in_dwell:
        return "dwell"
    return "full" if full else "grow"


__all__ = [
    "DWELL_STATE", "NO_GROWTH_YET", "SpectralGaps", "TrackedPair", "bidirectional_action", "coupled_mca_step",
    "coupled_oja_step", "coupling_weight", "dwell_checks", "dwell_iterations", "exact_spectral_gaps",
    "next_extreme_eigenvalue", "track_coupled_pair", "tracked_spectral_gaps",
]

"""INCRT (docs/ddcl_incrt.md, 'The spectral gate'): the spectral gate deciding when a layer's attention grows
or prunes a head.

The gate of one layer, on that layer's input X (N sampled tokens x d):

    M_a   = sum_h (W_Q^h W_K^h^T - W_K^h W_Q^h^T) / 2     directional_matrix     (directional, antisymmetric)
    A_sym = (C M_a + (C M_a)^T) / 2,  C = X^T X / N        interaction_matrix
    A_res = P A_sym P,  P = I - Q^T Q                      deflate                (Q: directions given a head)
    grow  when lambda_max(A_res) > theta_w, along u+      (Oja's rule; `eigh` is the exact reference)
    prune a head whose ||C M_a^h||_F < phi_g for T checks  head_directional_energy
    stop  when lambda_max(A_res) <= theta_w

C is X^T X divided by N (a project choice: theta_w then does not depend on how many tokens are sampled).
W_Q^h here is the (d x D) matrix with q = x W_Q^h, i.e. the transpose of the head's `nn.Linear` weight.
The functions below are pure tensor code (tested on planted spectra without a model); `IncrtGate` keeps
the per-layer state as fixed-shape buffers so checkpoints and resumed runs carry it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from geoformers.modeling.bidirectional_gate import (
    DWELL_STATE,
    NO_GROWTH_YET,
    TrackedPair,
    bidirectional_action,
    coupling_weight,
    dwell_checks,
    exact_spectral_gaps,
    track_coupled_pair,
    tracked_spectral_gaps,
)

EPS = 1e-12
RESTART_NORM = 1e-3  # a warm start shorter than this after deflation is replaced by a seeded vector


# ---------------------------------------------------------------------------------------------------------
# Functional core
# ---------------------------------------------------------------------------------------------------------


def directional_matrix(query_weights: torch.Tensor, key_weights: torch.Tensor) -> torch.Tensor:
    """INCRT gate, directional part: M_a = sum_h (W_Q^h W_K^h^T - W_K^h W_Q^h^T) / 2.

    query_weights, key_weights: (H, D, d) stacked `nn.Linear` weights -> (d, d), antisymmetric.
    """
    bilinear = torch.einsum("hrd,hre->de", query_weights, key_weights)
    return (bilinear - bilinear.T) / 2


def head_directional_energy(second_moment: torch.Tensor, query_weights: torch.Tensor,
                            key_weights: torch.Tensor) -> torch.Tensor:
    """INCRT prune criterion ||C M_a^h||_F per head -> (H,), without forming a d x d matrix per head.

    C M_a^h = L R^T / 2 with L = [C W_Q, -C W_K], R = [W_K, W_Q] (d x 2D), so ||C M_a^h||_F^2 =
    <L^T L, R^T R> / 4: two 2D x 2D Gram matrices per head.
    """
    w_q = query_weights.transpose(1, 2)
    w_k = key_weights.transpose(1, 2)
    left = torch.cat([second_moment @ w_q, -(second_moment @ w_k)], dim=2)
    right = torch.cat([w_k, w_q], dim=2)
    squared = ((left.transpose(1, 2) @ left) * (right.transpose(1, 2) @ right)).sum(dim=(1, 2))
    return squared.clamp_min(0.0).sqrt() / 2


def interaction_matrix(second_moment: torch.Tensor, directional: torch.Tensor) -> torch.Tensor:
    """INCRT gate: A = C M_a, A_sym = (A + A^T) / 2. Traceless when M_a is antisymmetric, hence indefinite."""
    interaction = second_moment @ directional
    return (interaction + interaction.T) / 2


def project_out(vector: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """P v = v - Q^T (Q v) for a basis Q (r x d) with orthonormal rows."""
    return vector - basis.T @ (basis @ vector)


def deflate(symmetric: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """INCRT gate, deflated residual: A_res = P A_sym P, P = I - Q^T Q (Q: r x d, orthonormal rows)."""
    if basis.shape[0] == 0:
        return symmetric
    identity = torch.eye(symmetric.shape[0], dtype=symmetric.dtype, device=symmetric.device)
    projector = identity - basis.T @ basis
    return projector @ symmetric @ projector


def spectral_radius_bound(matrix: torch.Tensor) -> torch.Tensor:
    """max |lambda_i| <= (sum_i lambda_i^4)^(1/4) = ||A A||_F^(1/2) for symmetric A (Schatten-4 norm).

    One matrix product; tighter than ||A||_F = (sum_i lambda_i^2)^(1/2) by up to d^(1/4) on spread spectra,
    which is what sets the trackers' speed.
    """
    return torch.linalg.matrix_norm(matrix @ matrix).sqrt()


def oja_step(vector: torch.Tensor, product: torch.Tensor, rate: float) -> torch.Tensor:
    """Oja's rule for the top eigenvector: u <- normalize(u + eta A u), given product = A u.

    A_sym is indefinite, and the iteration is a power iteration on I + eta A: it converges to the largest
    *signed* eigenvalue only while I + eta A is positive definite. `track_eigenvector` takes
    eta = step / b with step <= 1 and b >= max |lambda_i| (`spectral_radius_bound`), which guarantees it.
    """
    updated = vector + rate * product
    return updated / updated.norm().clamp_min(EPS)


def mca_exin_step(vector: torch.Tensor, product: torch.Tensor, rate: float) -> torch.Tensor:
    """MCA EXIN (Cirrincione) for the minor eigenvector: u <- u - eta/(u^T u) [A u - (u^T A u / u^T u) u].

    It is gradient descent on the Rayleigh quotient; the step is orthogonal to u, so renormalising afterwards
    only removes MCA EXIN's slow norm growth (and keeps eta = step / b meaningful, as for `oja_step`).
    """
    norm_sq = (vector @ vector).clamp_min(EPS)
    rayleigh = (vector @ product) / norm_sq
    updated = vector - rate / norm_sq * (product - rayleigh * vector)
    return updated / updated.norm().clamp_min(EPS)


class TrackedEigenpair(NamedTuple):
    vector: torch.Tensor  # unit vector
    eigenvalue: float  # its Rayleigh quotient rho = u^T A u
    residual: float  # ||A u - rho u|| / max(|rho|, floor): an eigenvalue lies within residual * |rho| of rho
    steps: int  # tracker iterations taken


def track_eigenvector(
    matrix: torch.Tensor,
    start: torch.Tensor,
    *,
    step: float,
    max_steps: int,
    tolerance: float,
    floor: float = 0.0,
    minor: bool = False,
    spectral_bound: float | None = None,
) -> TrackedEigenpair:
    """Warm-started Oja (top) or MCA EXIN (`minor=True`) iterations on a symmetric matrix with
    eta = step / spectral_bound (default `spectral_radius_bound`), until the relative residual
    ||A u - rho u|| / max(|rho|, floor) <= tolerance or `max_steps` updates. `floor` (the gate passes
    theta_w) keeps a top eigenvalue of exactly zero from never converging."""
    if spectral_bound is None:
        spectral_bound = float(spectral_radius_bound(matrix))
    rate = step / max(spectral_bound, EPS)
    update = mca_exin_step if minor else oja_step
    vector = start / start.norm().clamp_min(EPS)
    steps = 0
    while True:
        product = matrix @ vector
        rayleigh = float(vector @ product)
        residual = float((product - rayleigh * vector).norm()) / max(abs(rayleigh), floor, EPS)
        if residual <= tolerance or steps == max_steps:
            return TrackedEigenpair(vector, rayleigh, residual, steps)
        vector = update(vector, product, rate)
        steps += 1


class ExactEigenpairs(NamedTuple):
    lambda_max: float
    top: torch.Tensor
    lambda_min: float
    minor: torch.Tensor


def exact_extreme_eigenpairs(matrix: torch.Tensor) -> ExactEigenpairs:
    """Reference for the trackers: the extreme eigenpairs of a symmetric matrix by `eigh` in float64."""
    eigenvalues, eigenvectors = torch.linalg.eigh(matrix.double())
    top, minor = eigenvectors[:, -1].to(matrix.dtype), eigenvectors[:, 0].to(matrix.dtype)
    return ExactEigenpairs(float(eigenvalues[-1]), top, float(eigenvalues[0]), minor)


def seeded_unit_vector(dim: int, seed: int) -> torch.Tensor:
    """A deterministic random unit vector (same on every process: tracker starts and restarts)."""
    generator = torch.Generator().manual_seed(seed)
    vector = torch.randn(dim, generator=generator, dtype=torch.float64)
    return (vector / vector.norm()).float()


# ---------------------------------------------------------------------------------------------------------
# Gate state and decisions
# ---------------------------------------------------------------------------------------------------------

@dataclass
class GateDecision:
    """One layer's gate verdict (INCRT gate).

    action: "calibrating" (theta_w not set yet), "pending" (top tracker not converged, check again),
    "grow" (lambda_max > theta_w), "full" (would grow but the layer has `max_heads`), "stop".
    lambda_max / lambda_min: Rayleigh quotients of u+ / u- on A_res (lambda_max is a lower bound of the
    true top eigenvalue, tight once converged). prune: heads to remove, in decreasing index order so they
    can be pruned one after another.
    """

    layer: int
    action: str
    lambda_max: float
    lambda_min: float
    theta_w: float
    residual_norm: float
    tracker_residual: float
    direction: torch.Tensor = field(repr=False)
    head_energies: list[float]
    prune: list[int]


class IncrtGate(nn.Module):
    """Per-layer INCRT gate state, as persistent buffers of fixed shape (hidden size d, cap m = max_heads):

    u_plus, u_minus (d): Oja / MCA EXIN vectors, warm starts of the next check; basis (m x d) with
    basis_owner (m, head index or -1) and basis_size: the deflation basis Q, one row per head grown along
    a direction; theta_w (the latest one under the "relative" threshold) and calibrated; calibration_norms
    (||A_res||_F of the first checks) and num_checks; prune_counters (m): consecutive checks each head spent
    below phi_g = gate_prune_factor * theta_w. Under `gate_rule="bidirectional"` also last_growth_check (the
    check that grew the layer last) and spectral_gaps (Delta+ / b, Delta- / b of the last check), saved in
    checkpoints only under that rule (docs/growth_gate.md).
    """

    def __init__(self, config, layer_index: int):
        super().__init__()
        self.config = config
        self.layer_index = layer_index
        bidirectional = config.gate_rule == "bidirectional"
        for name, value in self.initial_state().items():
            self.register_buffer(name, value,
                                 persistent=bidirectional or name not in DWELL_STATE)

    def initial_state(self) -> dict[str, torch.Tensor]:
        """Buffer values of a fresh gate (used by the constructor and by `_init_weights`)."""
        config = self.config
        dim, capacity = config.hidden_size, config.max_heads
        return {
            "u_plus": seeded_unit_vector(dim, seed=2 * self.layer_index),
            "u_minus": seeded_unit_vector(dim, seed=2 * self.layer_index + 1),
            "basis": torch.zeros(capacity, dim),
            "basis_owner": torch.full((capacity,), -1, dtype=torch.long),
            "basis_size": torch.tensor(0, dtype=torch.long),
            "theta_w": torch.tensor(float(config.gate_theta_w or 0.0)),
            "calibrated": torch.tensor(
                config.gate_theta_w is not None or config.gate_threshold == "relative"
            ),
            "calibration_norms": torch.zeros(config.gate_calibration_checks),
            "num_checks": torch.tensor(0, dtype=torch.long),
            "prune_counters": torch.zeros(capacity, dtype=torch.long),
            "last_growth_check": torch.tensor(NO_GROWTH_YET, dtype=torch.long),
            "spectral_gaps": torch.zeros(2),
        }

    def active_basis(self) -> torch.Tensor:
        return self.basis[: int(self.basis_size)]

    def _warm_start(self, vector: torch.Tensor, seed: int) -> torch.Tensor:
        """Previous tracker vector with the deflated directions removed; a seeded one if nothing is left."""
        basis = self.active_basis()
        start = project_out(vector, basis)
        if start.norm() < RESTART_NORM:
            start = project_out(seeded_unit_vector(vector.shape[0], seed).to(vector.device), basis)
        return start

    def _calibrate(self, residual_norm: float) -> None:
        """theta_w = gate_calibration_factor * median ||A_res||_F over the first checks (author's code; the
        "relative" `gate_threshold` sets theta_w = factor * ||A_sym||_F at every check in `check`)."""
        index = int(self.num_checks) - 1
        self.calibration_norms[index] = residual_norm
        if index + 1 == self.calibration_norms.shape[0]:
            median = float(torch.quantile(self.calibration_norms, 0.5))
            self.theta_w.fill_(self.config.gate_calibration_factor * median)
            self.calibrated.fill_(True)

    def _update_prune_counters(self, head_energies: torch.Tensor) -> list[int]:
        """Count consecutive checks below phi_g per head; heads at `gate_prune_patience` are to be pruned
        (never all of them: the highest-energy head stays)."""
        num_heads = head_energies.shape[0]
        threshold = self.config.gate_prune_factor * float(self.theta_w)
        below = head_energies < threshold
        counters = self.prune_counters[:num_heads]
        self.prune_counters[:num_heads] = torch.where(below, counters + 1, torch.zeros_like(counters))
        self.prune_counters[num_heads:] = 0
        patience = self.config.gate_prune_patience
        candidates = [h for h in range(num_heads) if int(self.prune_counters[h]) >= patience]
        if len(candidates) == num_heads:
            candidates.remove(int(head_energies.argmax()))
        return sorted(candidates, reverse=True)

    @torch.no_grad()
    def check(self, second_moment: torch.Tensor, directional: torch.Tensor,
              head_energies: torch.Tensor) -> GateDecision:
        """One gate check (INCRT gate): A_res, calibration, trackers, prune counters, decision; under
        `gate_rule="bidirectional"` the rule of `bidirectional_gate` (docs/growth_gate.md)."""
        config = self.config
        bidirectional = config.gate_rule == "bidirectional"
        with torch.autocast(device_type=second_moment.device.type, enabled=False):
            symmetric = interaction_matrix(second_moment.float(), directional.float())
            residual = deflate(symmetric, self.active_basis())
            residual_norm = float(torch.linalg.matrix_norm(residual))
            scale = float(torch.linalg.matrix_norm(symmetric))
            spectral_bound = float(spectral_radius_bound(residual))
            if not all(math.isfinite(value) for value in (residual_norm, scale, spectral_bound)):
                raise ValueError("the gate's matrices A_sym / A_res overflow float32 (C = X^T X / N or the "
                                 "query/key weights are too large); the gate state is left unchanged")
            self.num_checks += 1
            if config.gate_theta_w is None and config.gate_threshold == "relative":
                self.theta_w.fill_(config.gate_calibration_factor * scale)
            elif not bool(self.calibrated):
                self._calibrate(residual_norm)
            if config.gate_use_exact_eigh:
                exact = exact_extreme_eigenpairs(residual)
                top = TrackedEigenpair(exact.top, exact.lambda_max, 0.0, 0)
                minor = TrackedEigenpair(exact.minor, exact.lambda_min, 0.0, 0)
            else:
                seed = 1000 * (self.layer_index + 1) + int(self.basis_size)
                rates = (config.gate_oja_step / max(spectral_bound, EPS),
                         config.gate_mca_step / max(spectral_bound, EPS))
                tracker = {
                    "max_steps": config.gate_tracker_steps, "tolerance": config.gate_tracker_tolerance,
                    "floor": float(self.theta_w), "spectral_bound": spectral_bound,
                }
                starts = (self._warm_start(self.u_plus, seed), self._warm_start(self.u_minus, seed + 500))
                if bidirectional and config.gate_couple_trackers:
                    pair = track_coupled_pair(
                        residual, *starts, rates=rates, gamma=coupling_weight(*self.spectral_gaps.tolist()),
                        max_steps=tracker["max_steps"], tolerance=tracker["tolerance"],
                        floor=tracker["floor"])
                    top = TrackedEigenpair(pair.top, pair.lambda_max, pair.top_residual, pair.steps)
                    minor = TrackedEigenpair(pair.minor, pair.lambda_min, pair.minor_residual, pair.steps)
                else:
                    top = track_eigenvector(residual, starts[0], step=config.gate_oja_step, **tracker)
                    minor = track_eigenvector(residual, starts[1], step=config.gate_mca_step, minor=True,
                                              **tracker)
            if bidirectional:
                gaps = self._spectral_gaps(residual, top, minor, spectral_bound)
                self.spectral_gaps.copy_(torch.tensor(gaps))
            self.u_plus.copy_(top.vector)
            self.u_minus.copy_(minor.vector)
        theta_w = float(self.theta_w)
        prune: list[int] = []
        if not bool(self.calibrated):
            action = "calibrating"
        else:
            prune = self._update_prune_counters(head_energies.float())
            phi_w = config.gate_phi_w_factor * theta_w
            # u-'s Rayleigh quotient bounds lambda_min from above: rho- < phi_w settles the test unconverged
            minor_unsettled = (bidirectional and config.gate_use_lambda_min_test and minor.eigenvalue >= phi_w
                               and minor.residual > config.gate_tracker_tolerance)
            if top.residual > config.gate_tracker_tolerance or minor_unsettled:
                action = "pending"
            elif bidirectional:
                action = bidirectional_action(
                    top.eigenvalue, minor.eigenvalue, theta_w=theta_w, phi_w=phi_w,
                    use_lambda_min=config.gate_use_lambda_min_test, in_dwell=self._in_dwell(),
                    full=head_energies.shape[0] >= config.max_heads)
            elif top.eigenvalue > theta_w:
                action = "full" if head_energies.shape[0] >= config.max_heads else "grow"
            else:
                action = "stop"
        return GateDecision(
            layer=self.layer_index, action=action, lambda_max=top.eigenvalue, lambda_min=minor.eigenvalue,
            theta_w=theta_w, residual_norm=residual_norm, tracker_residual=top.residual,
            direction=top.vector.clone(), head_energies=head_energies.tolist(), prune=prune,
        )

    def _spectral_gaps(self, residual: torch.Tensor, top: TrackedEigenpair, minor: TrackedEigenpair,
                       bound: float) -> tuple[float, float]:
        """(Delta+, Delta-) / b of A_res: exact with `gate_use_exact_eigh`, else from the trackers."""
        if self.config.gate_use_exact_eigh:
            return exact_spectral_gaps(residual, bound)
        config = self.config
        seed = 1000 * (self.layer_index + 1) + int(self.basis_size) + 250
        starts = tuple(project_out(seeded_unit_vector(residual.shape[0], seed + k).to(residual),
                                   self.active_basis()) for k in (0, 1))
        pair = TrackedPair(top.vector, top.eigenvalue, top.residual, minor.vector, minor.eigenvalue,
                           minor.residual, top.steps)
        rates = (config.gate_oja_step / max(bound, EPS), config.gate_mca_step / max(bound, EPS))
        return tracked_spectral_gaps(residual, pair, starts, bound=bound, rates=rates,
                                     max_steps=config.gate_tracker_steps)

    def _in_dwell(self) -> bool:
        """Fewer than T_d checks since the layer's last growth (`gate_use_dwell`; docs/growth_gate.md)."""
        last = int(self.last_growth_check)
        if not self.config.gate_use_dwell or last == NO_GROWTH_YET:
            return False
        config = self.config
        dwell = dwell_checks(
            config.gate_oja_step, float(self.spectral_gaps[0]), kappa_t=config.gate_dwell_kappa,
            eps=config.gate_dwell_eps, iterations_per_check=config.gate_tracker_steps)
        return int(self.num_checks) - last < dwell

    @torch.no_grad()
    def record_growth(self, head_index: int, direction: torch.Tensor | None) -> None:
        """A head was appended at `head_index`; a direction it was given joins the deflation basis Q
        (Gram-Schmidt, twice for stability; a direction already inside span(Q) adds no row). The dwell of
        the bidirectional rule counts from the current check."""
        self.prune_counters[head_index] = 0
        self.last_growth_check.fill_(int(self.num_checks))
        if direction is None:
            return
        basis = self.active_basis()
        row = project_out(direction.to(self.basis.dtype), basis)
        if row.norm() < RESTART_NORM * direction.norm():
            return
        row = project_out(row / row.norm(), basis)
        size = int(self.basis_size)
        self.basis[size] = row / row.norm()
        self.basis_owner[size] = head_index
        self.basis_size += 1

    @torch.no_grad()
    def record_pruning(self, head_index: int) -> None:
        """Head `head_index` was removed: drop the basis rows it owned, shift later owners and counters."""
        size = int(self.basis_size)
        owners = self.basis_owner[:size]
        keep = owners != head_index
        rows, kept_owners = self.basis[:size][keep].clone(), owners[keep].clone()
        kept_owners[kept_owners > head_index] -= 1
        self.basis.zero_()
        self.basis_owner.fill_(-1)
        self.basis[: rows.shape[0]] = rows
        self.basis_owner[: rows.shape[0]] = kept_owners
        self.basis_size.fill_(rows.shape[0])
        counters = self.prune_counters.clone()
        self.prune_counters[head_index:-1] = counters[head_index + 1:]
        self.prune_counters[-1] = 0

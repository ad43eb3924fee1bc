"""INCRT (docs/ddcl_incrt.md, 'The spectral gate' and 'Growth and pruning'; docs/growth_gate.md): the
spectral gate that decides when a layer's attention grows or prunes a head, and the growth API that acts on
its decisions.

The gate of one layer, on that layer's input X (N sampled tokens x d):

    M_a   = sum_h (W_Q^h W_K^h^T - W_K^h W_Q^h^T) / 2     directional_matrix     (directional, antisymmetric)
    A_sym = (C M_a + (C M_a)^T) / 2,  C = X^T X / N        interaction_matrix
    A_res = P A_sym P,  P = I - Q^T Q                      deflate                (Q: directions given a head)
    grow  when lambda_max(A_res) > theta_w, along u+      (Oja's rule; `eigh` is the exact reference)
    prune a head whose ||C M_a^h||_F < phi_g for T checks  head_directional_energy
    stop  when lambda_max(A_res) <= theta_w

The bidirectional rule (`gate_rule="bidirectional"`, the author's) lets both trackers decide:

    grow   when lambda_max(A_res) > theta_w and lambda_min(A_res) < phi_w (phi_w = phi_w_factor * theta_w)
           and at least T_d checks after the layer's last growth (the dwell)
    T_d    = ceil(kappa_T / (eta * Delta+^2) * log(1 / eps))  tracker iterations; Delta+ = lambda_1 - lambda_2
    gamma* = Delta+ / (Delta+ + Delta-)                        Delta- = lambda_{d-1} - lambda_d
    u+    <- normalize(u+ + eta+ [A u+ - (1 - gamma*) c u-])   c = u+^T A u-
    u-    <- orthogonalize(normalize(u- - eta- (A u- - rho- u-) + eta- gamma* (1 - gamma*) c u+), u+)

Its quantities are dimensionless in the spectral-radius bound b of A_res (`spectral_radius_bound`): the
trackers step by eta = step / b, so eta * Delta^2 in T_d is read as step * (Delta / b)^2 and the gaps are
stored as Delta / b. Each gate check runs up to `tracker_steps` tracker iterations (the callback's cadence),
so T_d iterations are ceil(T_d / tracker_steps) checks (`dwell_checks`).

C is X^T X divided by N (a project choice: theta_w then does not depend on how many tokens are sampled).
W_Q^h here is the (d x D) matrix with q = x W_Q^h, i.e. the transpose of the head's `nn.Linear` weight.
The functions below are pure tensor code (tested on planted spectra without a model). A rule is an object:
`IncrtGate` keeps a layer's state as fixed-shape buffers (so checkpoints and resumed runs carry it),
`observe` measures one check and `decide` gives the verdict, one subclass per `gate_rule` (`MaxOnlyGate`,
`BidirectionalGate`). `HeadGrowthMixin` gives the model `gate_check` (every layer's gate on a batch) and the
edits (`grow_head`, `prune_head`, `resize_heads`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from geoformers.models.config_validation import MAX_SIZE, check_number

EPS = 1e-12
RESTART_NORM = 1e-3  # a warm start shorter than this after deflation is replaced by a seeded vector
LOSS_FLOOR = 1e-3  # nats: the need rule's plateau and adoption tests treat smaller loss changes as none


# ---------------------------------------------------------------------------------------------------------
# Functional core
# ---------------------------------------------------------------------------------------------------------


def directional_matrix(query_weights: torch.Tensor, key_weights: torch.Tensor) -> torch.Tensor:
    """INCRT gate, directional part: M_a = sum_h (W_Q^h W_K^h^T - W_K^h W_Q^h^T) / 2.

    query_weights, key_weights: (H, D, d) stacked `nn.Linear` weights -> (d, d), antisymmetric.
    """
    bilinear = torch.einsum("hrd,hre->de", query_weights, key_weights)
    return (bilinear - bilinear.T) / 2


def head_directional_energy(
    second_moment: torch.Tensor, query_weights: torch.Tensor, key_weights: torch.Tensor
) -> torch.Tensor:
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
# The bidirectional rule (docs/growth_gate.md, "The rules")
# ---------------------------------------------------------------------------------------------------------

NO_GROWTH_YET = -1  # `last_growth_check` of a layer that has not grown: no dwell applies
# The author's notebook: a gap below 1e-8 (a degenerate top eigenvalue) gives a dwell of 10000 iterations.
DEGENERATE_GAP, DEGENERATE_DWELL = 1e-8, 10000


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
    return 0.5 if total < EPS else gap_plus / total


def _unit(vector: torch.Tensor) -> torch.Tensor:
    return vector / vector.norm().clamp_min(EPS)


def _orthogonal_to(vector: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
    return _unit(vector - (vector @ unit) * unit)


def coupled_oja_step(
    u_plus: torch.Tensor, u_minus: torch.Tensor, matrix: torch.Tensor, rate: float, gamma: float
) -> torch.Tensor:
    """Oja's step for the unit u+ (as `incrt.oja_step`: u + eta A u, normalised) with the author's coupling
    term -eta (1 - gamma*) (u+^T A u-) u-."""
    coupling = float(u_plus @ (matrix @ u_minus))
    return _unit(u_plus + rate * (matrix @ u_plus - (1.0 - gamma) * coupling * u_minus))


def coupled_mca_step(
    u_minus: torch.Tensor, u_plus: torch.Tensor, matrix: torch.Tensor, rate: float, gamma: float
) -> torch.Tensor:
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
    return rayleigh, float((product - rayleigh * vector).norm()) / max(abs(rayleigh), floor, EPS)


def track_coupled_pair(
    matrix: torch.Tensor,
    u_plus: torch.Tensor,
    u_minus: torch.Tensor,
    *,
    rates: tuple,
    gamma: float,
    max_steps: int,
    tolerance: float,
    floor: float,
) -> TrackedPair:
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


def next_extreme_eigenvalue(
    matrix: torch.Tensor,
    found: torch.Tensor,
    start: torch.Tensor,
    *,
    minor: bool,
    rate: float,
    max_steps: int,
) -> float:
    """lambda_2 (or lambda_{d-1} with `minor`): the top (bottom) Rayleigh quotient of A on the complement of
    the unit eigenvector estimate `found`, by power steps u +- eta A u kept orthogonal to it, `max_steps`
    of them from `start` (a gap estimate, not a decision)."""
    sign = -1.0 if minor else 1.0
    vector = _orthogonal_to(start, found)
    for _ in range(max_steps):
        vector = _orthogonal_to(vector + sign * rate * (matrix @ vector), found)
    return float(vector @ (matrix @ vector))


def tracked_spectral_gaps(
    matrix: torch.Tensor, pair: TrackedPair, starts: tuple, *, bound: float, rates: tuple, max_steps: int
) -> SpectralGaps:
    """Delta+ / b and Delta- / b from the trackers' Rayleigh quotients (lambda_max, lambda_min) and one more
    tracker each for lambda_2 and lambda_{d-1} (`next_extreme_eigenvalue`); clamped at 0."""
    second = next_extreme_eigenvalue(
        matrix, pair.top, starts[0], minor=False, rate=rates[0], max_steps=max_steps
    )
    penultimate = next_extreme_eigenvalue(
        matrix, pair.minor, starts[1], minor=True, rate=rates[1], max_steps=max_steps
    )
    scale = max(bound, EPS)
    return SpectralGaps(
        max(pair.lambda_max - second, 0.0) / scale, max(penultimate - pair.lambda_min, 0.0) / scale
    )


def exact_spectral_gaps(matrix: torch.Tensor, bound: float) -> SpectralGaps:
    """Reference for `tracked_spectral_gaps`: the gaps of `eigvalsh` in float64, divided by b."""
    eigenvalues = torch.linalg.eigvalsh(matrix.double())
    if eigenvalues.shape[0] < 2:
        return SpectralGaps(0.0, 0.0)
    scale = max(bound, EPS)
    return SpectralGaps(
        float(eigenvalues[-1] - eigenvalues[-2]) / scale, float(eigenvalues[1] - eigenvalues[0]) / scale
    )


def bidirectional_action(
    lambda_max: float,
    lambda_min: float,
    *,
    theta_w: float,
    phi_w: float,
    use_lambda_min: bool,
    in_dwell: bool,
    full: bool,
) -> str:
    """The rule's verdict on converged trackers: "grow", "dwell" (would grow, but within T_d checks of the
    last growth: check again), "full" (would grow at max_heads) or "stop" (lambda_max <= theta_w, or
    lambda_min >= phi_w: no negative direction left for a head to pair with)."""
    if lambda_max <= theta_w or (use_lambda_min and lambda_min >= phi_w):
        return "stop"
    if in_dwell:
        return "dwell"
    return "full" if full else "grow"


# ---------------------------------------------------------------------------------------------------------
# Gate rules: a layer's state and its decision (docs/growth_gate.md, 'Rules as objects')
# ---------------------------------------------------------------------------------------------------------

# Cadence defaults (docs/growth_gate.md, 'Cadence'): tokens of C per check and tracker iterations per check.
# `IncrtGrowthCallback` owns the cadence and passes both; these are the defaults of the model's methods.
DEFAULT_GATE_TOKENS = 512
DEFAULT_TRACKER_STEPS = 200


@dataclass
class GateDecision:
    """One layer's gate verdict (INCRT gate).

    action: "calibrating" (theta_w not set yet), "pending" (a tracker the rule reads has not converged: check
    again), "grow" (lambda_max > theta_w), "full" (would grow but the layer has `max_heads`), "stop", and
    under the bidirectional rule "dwell" (would grow, but within T_d checks of the last growth).
    lambda_max / lambda_min: Rayleigh quotients of u+ / u- on A_res (lambda_max is a lower bound of the
    true top eigenvalue, tight once converged). prune: heads to remove, in decreasing index order so they
    can be pruned one after another. direction: the unit vector a grown head attends along (None: the
    head's own initialisation); function_preserving: a grown head's o_proj starts at zero; prototypes_from:
    the head whose prototype bank a grown head starts from (None: a fresh one) (`grow_head`).
    """

    layer: int
    action: str
    lambda_max: float
    lambda_min: float
    theta_w: float
    residual_norm: float
    direction: torch.Tensor | None = field(repr=False)
    head_energies: list[float]
    prune: list[int]
    function_preserving: bool = True
    prototypes_from: int | None = None


class NeedEvidence(NamedTuple):
    """One layer's need test at one check (`gate_rule="need"`, docs/growth_gate.md, 'The need rule'):
    loss: the model's task loss on the gate batch; t and gain: the paired held-out loss drop of a probe
    that also reads the layer's token-mean input, as a t statistic and relative to the probe's loss
    without it; rise: the loss increase when the layer's newest grown head is removed (0 without one);
    error and error_with: the held-out classification errors of the probes without and with that input,
    on the same rows, error_drop = error - error_with and error_t the t statistic of the per-row error drop.
    Where no probe is read they are 0 (`unprobed`). fit_error: the model's own classification error on the
    rows of `loss` (1 where not measured)."""

    loss: float
    t: float
    gain: float
    rise: float
    error: float
    error_with: float
    error_drop: float
    error_t: float = 0.0
    fit_error: float = 1.0

    @classmethod
    def unprobed(cls, loss: float, rise: float = 0.0, fit_error: float = 1.0) -> NeedEvidence:
        """Evidence of a check whose verdict reads no probe: t, gain and the errors are 0."""
        return cls(loss, 0.0, 0.0, rise, 0.0, 0.0, 0.0, 0.0, fit_error)


class Observation(NamedTuple):
    """What `IncrtGate.observe` measured at one check: the input of `IncrtGate.decide`."""

    residual_norm: float  # ||A_res||_F
    theta_w: float
    top: TrackedEigenpair  # u+ and lambda_max
    minor: TrackedEigenpair  # u- and lambda_min
    head_energies: torch.Tensor  # ||C M_a^h||_F per head
    tracker_steps: int  # most tracker iterations this check ran (the cadence's)
    need: NeedEvidence | None = None  # the need test, read by `gate_rule="need"` only


class IncrtGate(nn.Module):
    """A layer's INCRT gate: the state every rule keeps, `observe` (one check's measurements) and `decide`
    (the verdict of the rule, one subclass per `gate_rule`: `GATE_RULE_CLASSES`; `build_gate` picks it).

    The state is persistent buffers of fixed shape (hidden size d, cap m = max_heads), so checkpoints and
    resumed runs carry it: u_plus, u_minus (d): Oja / MCA EXIN vectors, warm starts of the next check; basis
    (m x d) with basis_owner (m, head index or -1) and basis_size: the deflation basis Q, one row per head
    grown along a direction; theta_w (the latest one under the "relative" threshold) and calibrated (0 or 1,
    uint8: a bool buffer breaks transformers' state-dict tests; the bool one of an older checkpoint loads
    cast to uint8); calibration_norms (||A_res||_F of the first checks) and num_checks; prune_counters (m):
    consecutive checks each head spent below phi_g = gate_prune_factor * theta_w. A rule adds its own
    buffers in `initial_state`.

    The threshold (`gate_theta_w`, `gate_threshold`) and pruning are the same under every rule.
    """

    def __init__(self, config, layer_index: int):
        super().__init__()
        self.config = config
        self.layer_index = layer_index
        for name, value in self.initial_state().items():
            self.register_buffer(name, value)

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
                config.gate_theta_w is not None or config.gate_threshold == "relative", dtype=torch.uint8
            ),
            "calibration_norms": torch.zeros(config.gate_calibration_checks),
            "num_checks": torch.tensor(0, dtype=torch.long),
            "prune_counters": torch.zeros(capacity, dtype=torch.long),
        }

    def active_basis(self) -> torch.Tensor:
        return self.basis[: int(self.basis_size)]

    # ------------------------------------------------------------------------------------ observe

    @torch.no_grad()
    def observe(
        self,
        second_moment: torch.Tensor,
        directional: torch.Tensor,
        head_energies: torch.Tensor,
        *,
        tracker_steps: int = DEFAULT_TRACKER_STEPS,
        need: NeedEvidence | None = None,
    ) -> Observation:
        """One check's measurements (INCRT gate): A_res, theta_w (or a calibration step), u+ and u- by at
        most `tracker_steps` tracker iterations, and the layer's `need` test when given; updates the state
        they live in. Raises ValueError, the state unchanged, when the matrices overflow float32."""
        check_number("tracker_steps", tracker_steps, 1, MAX_SIZE, integer=True)
        with torch.autocast(device_type=second_moment.device.type, enabled=False):
            symmetric = interaction_matrix(second_moment.float(), directional.float())
            residual = deflate(symmetric, self.active_basis())
            residual_norm = float(torch.linalg.matrix_norm(residual))
            scale = float(torch.linalg.matrix_norm(symmetric))
            spectral_bound = float(spectral_radius_bound(residual))
            if not all(math.isfinite(value) for value in (residual_norm, scale, spectral_bound)):
                raise ValueError(
                    "the gate's matrices A_sym / A_res overflow float32 (C = X^T X / N or the "
                    "query/key weights are too large); the gate state is left unchanged"
                )
            self.num_checks += 1
            self._update_threshold(scale, residual_norm)
            top, minor = self._track(residual, spectral_bound, tracker_steps)
            self.u_plus.copy_(top.vector)
            self.u_minus.copy_(minor.vector)
        return Observation(
            residual_norm,
            float(self.theta_w),
            top,
            minor,
            head_energies.float(),
            tracker_steps,
            need,
        )

    def _update_threshold(self, scale: float, residual_norm: float) -> None:
        """theta_w: fixed (`gate_theta_w`), factor * ||A_sym||_F at every check ("relative"), or calibrated
        once ("calibrated")."""
        config = self.config
        if config.gate_theta_w is None and config.gate_threshold == "relative":
            self.theta_w.fill_(config.gate_calibration_factor * scale)
        elif not bool(self.calibrated):
            self._calibrate(residual_norm)

    def _calibrate(self, residual_norm: float) -> None:
        """theta_w = gate_calibration_factor * median ||A_res||_F over the first checks (author's code)."""
        index = int(self.num_checks) - 1
        self.calibration_norms[index] = residual_norm
        if index + 1 == self.calibration_norms.shape[0]:
            median = float(torch.quantile(self.calibration_norms, 0.5))
            self.theta_w.fill_(self.config.gate_calibration_factor * median)
            self.calibrated.fill_(1)

    def _track(
        self, residual: torch.Tensor, spectral_bound: float, tracker_steps: int
    ) -> tuple[TrackedEigenpair, TrackedEigenpair]:
        """u+ and u- of A_res: `eigh` with `gate_use_exact_eigh`, else the rule's trackers (`_iterate`) from
        the previous check's vectors."""
        if self.config.gate_use_exact_eigh:
            exact = exact_extreme_eigenpairs(residual)
            return (
                TrackedEigenpair(exact.top, exact.lambda_max, 0.0, 0),
                TrackedEigenpair(exact.minor, exact.lambda_min, 0.0, 0),
            )
        seed = 1000 * (self.layer_index + 1) + int(self.basis_size)
        starts = (self._warm_start(self.u_plus, seed), self._warm_start(self.u_minus, seed + 500))
        return self._iterate(residual, starts, spectral_bound, tracker_steps)

    def _warm_start(self, vector: torch.Tensor, seed: int) -> torch.Tensor:
        """Previous tracker vector with the deflated directions removed; a seeded one if nothing is left."""
        basis = self.active_basis()
        start = project_out(vector, basis)
        if start.norm() < RESTART_NORM:
            start = project_out(seeded_unit_vector(vector.shape[0], seed).to(vector.device), basis)
        return start

    def _iterate(
        self, residual: torch.Tensor, starts: tuple, spectral_bound: float, tracker_steps: int
    ) -> tuple[TrackedEigenpair, TrackedEigenpair]:
        """Independent trackers: Oja's rule for u+, MCA EXIN for u-."""
        config = self.config
        tracker = {
            "max_steps": tracker_steps,
            "tolerance": config.gate_tracker_tolerance,
            "floor": float(self.theta_w),
            "spectral_bound": spectral_bound,
        }
        top = track_eigenvector(residual, starts[0], step=config.gate_oja_step, **tracker)
        minor = track_eigenvector(residual, starts[1], step=config.gate_mca_step, minor=True, **tracker)
        return top, minor

    # ------------------------------------------------------------------------------------- decide

    @torch.no_grad()
    def decide(self, observation: Observation) -> GateDecision:
        """The verdict on an observation: "calibrating" until theta_w is set, else the prune list (the
        counters advance) and "pending" until the trackers the rule reads have converged, else the rule's
        `_verdict`."""
        prune: list[int] = []
        if not bool(self.calibrated):
            action = "calibrating"
        else:
            prune = self._update_prune_counters(observation.head_energies)
            action = self._verdict(observation) if self._settled(observation) else "pending"
        return GateDecision(
            layer=self.layer_index,
            action=action,
            lambda_max=observation.top.eigenvalue,
            lambda_min=observation.minor.eigenvalue,
            theta_w=observation.theta_w,
            residual_norm=observation.residual_norm,
            direction=observation.top.vector.clone(),
            head_energies=observation.head_energies.tolist(),
            prune=prune,
        )

    def _settled(self, observation: Observation) -> bool:
        """The top tracker has converged (relative residual <= `gate_tracker_tolerance`)."""
        return observation.top.residual <= self.config.gate_tracker_tolerance

    def _verdict(self, observation: Observation) -> str:
        """The rule's verdict on settled trackers: "grow", "full", "stop" or one of its own."""
        raise NotImplementedError(f"{type(self).__name__} must define the rule's `_verdict`")

    def _is_full(self, observation: Observation) -> bool:
        return observation.head_energies.shape[0] >= self.config.max_heads

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

    # -------------------------------------------------------------------------- growth and pruning

    @torch.no_grad()
    def record_growth(self, head_index: int, direction: torch.Tensor | None) -> None:
        """A head was appended at `head_index`; a direction it was given joins the deflation basis Q
        (Gram-Schmidt, twice for stability; a direction already inside span(Q) adds no row)."""
        self.prune_counters[head_index] = 0
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
        self.prune_counters[head_index:-1] = counters[head_index + 1 :]
        self.prune_counters[-1] = 0


class MaxOnlyGate(IncrtGate):
    """`gate_rule="max_only"`: grow while lambda_max(A_res) > theta_w, along u+; lambda_min is tracked and
    reported but does not decide (docs/growth_gate.md, '"max_only"')."""

    def _verdict(self, observation: Observation) -> str:
        if observation.top.eigenvalue > observation.theta_w:
            return "full" if self._is_full(observation) else "grow"
        return "stop"


class BidirectionalGate(IncrtGate):
    """`gate_rule="bidirectional"` (the author's rule, docs/growth_gate.md): grow when lambda_max(A_res) >
    theta_w and lambda_min(A_res) < phi_w, at least T_d checks after the layer's last growth, with coupled
    trackers. Its own state: last_growth_check (the check that grew the layer last) and spectral_gaps
    (Delta+ / b, Delta- / b of the last check). Ablations: `gate_use_lambda_min_test`, `gate_use_dwell`,
    `gate_couple_trackers`."""

    def initial_state(self) -> dict[str, torch.Tensor]:
        return {
            **super().initial_state(),
            "last_growth_check": torch.tensor(NO_GROWTH_YET, dtype=torch.long),
            "spectral_gaps": torch.zeros(2),
        }

    def _track(
        self, residual: torch.Tensor, spectral_bound: float, tracker_steps: int
    ) -> tuple[TrackedEigenpair, TrackedEigenpair]:
        """u+ and u-, then the gaps of A_res (for T_d now and gamma* at the next check)."""
        top, minor = super()._track(residual, spectral_bound, tracker_steps)
        gaps = self._spectral_gaps(residual, top, minor, spectral_bound, tracker_steps)
        self.spectral_gaps.copy_(torch.tensor(gaps))
        return top, minor

    def _iterate(
        self, residual: torch.Tensor, starts: tuple, spectral_bound: float, tracker_steps: int
    ) -> tuple[TrackedEigenpair, TrackedEigenpair]:
        """The coupled trackers with gamma* of the previous check's gaps (independent ones when
        `gate_couple_trackers` is False)."""
        config = self.config
        if not config.gate_couple_trackers:
            return super()._iterate(residual, starts, spectral_bound, tracker_steps)
        rates = (
            config.gate_oja_step / max(spectral_bound, EPS),
            config.gate_mca_step / max(spectral_bound, EPS),
        )
        pair = track_coupled_pair(
            residual,
            *starts,
            rates=rates,
            gamma=coupling_weight(*self.spectral_gaps.tolist()),
            max_steps=tracker_steps,
            tolerance=config.gate_tracker_tolerance,
            floor=float(self.theta_w),
        )
        return (
            TrackedEigenpair(pair.top, pair.lambda_max, pair.top_residual, pair.steps),
            TrackedEigenpair(pair.minor, pair.lambda_min, pair.minor_residual, pair.steps),
        )

    def _spectral_gaps(
        self,
        residual: torch.Tensor,
        top: TrackedEigenpair,
        minor: TrackedEigenpair,
        bound: float,
        tracker_steps: int,
    ) -> SpectralGaps:
        """(Delta+, Delta-) / b of A_res: exact with `gate_use_exact_eigh`, else from the trackers."""
        if self.config.gate_use_exact_eigh:
            return exact_spectral_gaps(residual, bound)
        config = self.config
        seed = 1000 * (self.layer_index + 1) + int(self.basis_size) + 250
        starts = tuple(
            project_out(seeded_unit_vector(residual.shape[0], seed + k).to(residual), self.active_basis())
            for k in (0, 1)
        )
        pair = TrackedPair(
            top.vector,
            top.eigenvalue,
            top.residual,
            minor.vector,
            minor.eigenvalue,
            minor.residual,
            top.steps,
        )
        rates = (config.gate_oja_step / max(bound, EPS), config.gate_mca_step / max(bound, EPS))
        return tracked_spectral_gaps(
            residual, pair, starts, bound=bound, rates=rates, max_steps=tracker_steps
        )

    def _phi_w(self, observation: Observation) -> float:
        return self.config.gate_phi_w_factor * observation.theta_w

    def _settled(self, observation: Observation) -> bool:
        """u+ has converged, and so has u- unless its Rayleigh quotient (an upper bound of lambda_min)
        already settles the lambda_min test (rho- < phi_w)."""
        config = self.config
        minor = observation.minor
        minor_unsettled = (
            config.gate_use_lambda_min_test
            and minor.eigenvalue >= self._phi_w(observation)
            and minor.residual > config.gate_tracker_tolerance
        )
        return super()._settled(observation) and not minor_unsettled

    def _verdict(self, observation: Observation) -> str:
        return bidirectional_action(
            observation.top.eigenvalue,
            observation.minor.eigenvalue,
            theta_w=observation.theta_w,
            phi_w=self._phi_w(observation),
            use_lambda_min=self.config.gate_use_lambda_min_test,
            in_dwell=self._in_dwell(observation.tracker_steps),
            full=self._is_full(observation),
        )

    def _in_dwell(self, tracker_steps: int) -> bool:
        """Fewer than T_d checks since the layer's last growth (`gate_use_dwell`), T_d in checks of
        `tracker_steps` iterations (docs/growth_gate.md)."""
        last = int(self.last_growth_check)
        if not self.config.gate_use_dwell or last == NO_GROWTH_YET:
            return False
        config = self.config
        dwell = dwell_checks(
            config.gate_oja_step,
            float(self.spectral_gaps[0]),
            kappa_t=config.gate_dwell_kappa,
            eps=config.gate_dwell_eps,
            iterations_per_check=tracker_steps,
        )
        return int(self.num_checks) - last < dwell

    @torch.no_grad()
    def record_growth(self, head_index: int, direction: torch.Tensor | None) -> None:
        """As `IncrtGate.record_growth`; the dwell counts from the current check."""
        super().record_growth(head_index, direction)
        self.last_growth_check.fill_(int(self.num_checks))


class NeedGate(IncrtGate):
    """`gate_rule="need"` (docs/growth_gate.md, 'The need rule'): grow when a held-out probe says one more
    head would lower the held-out error, significantly (`needs`), at a plateau of the loss once
    the newest grown head is in use or `gate_need_patience` settled checks after its growth; stop when the
    probe says no, at such a plateau, at the layer's first probe, or once the model fits its monitor rows
    (`phase`: "fitted"; a head that still waits cannot buy accuracy there). A grown head keeps its own
    initialisation (o_proj included: a zero o_proj starts it at a saddle), so growth is not
    function-preserving, but starts from the prototype bank of the layer's first head: a fresh bank passes
    the head's output on at a few percent of its gain (docs/growth_gate.md, 'The need rule'). The spectral
    part of the check still runs: pruning is the base class's.
    Its own state: need_last_loss (the plateau reference: the previous check's loss, or the one
    `record_loss` set; -1: none), need_probed (1 once a verdict read the probe), need_newest_head (-1: none
    grown yet), need_waiting (settled checks since that growth)."""

    def initial_state(self) -> dict[str, torch.Tensor]:
        return {
            **super().initial_state(),
            "need_last_loss": torch.tensor(-1.0),
            "need_probed": torch.tensor(0, dtype=torch.long),
            "need_newest_head": torch.tensor(-1, dtype=torch.long),
            "need_waiting": torch.tensor(0, dtype=torch.long),
        }

    def decide(self, observation: Observation) -> GateDecision:
        if observation.need is None:
            raise ValueError(
                '`gate_rule="need"` decides on a need test: pass `need=need_evidence(model, batch)` to '
                "`gate_check` (IncrtGrowthCallback does)"
            )
        decision = super().decide(observation)
        decision.direction, decision.function_preserving, decision.prototypes_from = None, False, 0
        return decision

    def _settled(self, observation: Observation) -> bool:
        return True  # the rule reads no tracker

    @torch.no_grad()
    def record_loss(self, loss: float) -> None:
        """The plateau reference of the next check (e.g. the loss when growth starts), without a check."""
        self.need_last_loss.fill_(loss)

    def phase(self, loss: float, rise: float, fit_error: float = 1.0) -> str:
        """Where a check with this task loss, newest-head `rise` and model error on the monitor rows
        `fit_error` stands: `settling`'s phase, but a "moving" or "waiting" check of a model whose
        `fit_error` is at most `gate_need_error` is "fitted": no head can buy more accuracy on rows it
        already fits, so its verdict reads the probe and may stop."""
        return self._fitted(self.settling(loss, rise), fit_error)

    def settling(self, loss: float, rise: float) -> str:
        """While the loss moves (by more than `gate_need_plateau` of the reference's and more than
        `LOSS_FLOOR`, or no reference yet) "first" until a verdict has read the probe, then "moving"; at a
        plateau "waiting" (the newest grown head is unused: its removal raises the loss by at most
        `gate_need_adoption` of it, and fewer than `gate_need_patience` settled checks passed since its
        growth) or "ready"."""
        config = self.config
        if float(self.need_last_loss) < 0 or self.moving(loss):
            return "moving" if int(self.need_probed) else "first"
        used = int(self.need_newest_head) < 0 or rise > config.gate_need_adoption * max(loss, LOSS_FLOOR)
        if used or int(self.need_waiting) + 1 >= config.gate_need_patience:
            return "ready"
        return "waiting"

    def _fitted(self, phase: str, fit_error: float) -> str:
        fitted = phase in ("moving", "waiting") and fit_error <= self.config.gate_need_error
        return "fitted" if fitted else phase

    def moving(self, loss: float) -> bool:
        """The loss moved by more than `gate_need_plateau` of the reference's (`need_last_loss`) and by more
        than `LOSS_FLOOR` (False without a reference)."""
        previous = float(self.need_last_loss)
        return previous >= 0 and abs(previous - loss) > max(
            self.config.gate_need_plateau * previous, LOSS_FLOOR
        )

    def reads_probe(self, loss: float, rise: float, fit_error: float = 1.0) -> bool:
        """Whether this check's verdict reads the probe test (`need_evidence` fits the probes only then)."""
        return self.phase(loss, rise, fit_error) in ("first", "fitted", "ready")

    def _verdict(self, observation: Observation) -> str:
        """ "pending" while the loss moves or the newest head waits; else "stop" when the probe finds no
        need; else "pending" at a first probe while the loss moves (growth waits for a plateau: a model
        still learning shows drops it is about to earn) or at a "fitted" check (the loss still moves or the
        newest head still waits), "grow" or "full"."""
        need = observation.need
        settling = self.settling(need.loss, need.rise)
        phase = self._fitted(settling, need.fit_error)
        self.need_last_loss.fill_(need.loss)
        if settling == "waiting":  # fitted or not, a settled check the newest head waits counts
            self.need_waiting += 1
        if phase in ("moving", "waiting"):
            return "pending"
        self.need_probed.fill_(1)
        if not self.needs(need):
            return "stop"
        if phase in ("first", "fitted"):
            return "pending"
        return "full" if self._is_full(observation) else "grow"

    def needs(self, need: NeedEvidence) -> bool:
        """The probe test finds a need: a held-out error drop > `gate_need_error` (a loss drop that buys no
        accuracy, e.g. of a probe already at zero error, is no need) that is significant, on the loss (t >
        `gate_need_t` and gain > `gate_need_gain`) or on the per-row errors themselves (their t >
        `gate_need_t`: a probe that overfits its cross-entropy can hide a large accuracy gain)."""
        config = self.config
        significant = (
            need.t > config.gate_need_t and need.gain > config.gate_need_gain
        ) or need.error_t > config.gate_need_t
        return significant and need.error_drop > config.gate_need_error

    @torch.no_grad()
    def record_growth(self, head_index: int, direction: torch.Tensor | None) -> None:
        super().record_growth(head_index, direction)
        self.need_newest_head.fill_(head_index)
        self.need_waiting.zero_()

    @torch.no_grad()
    def record_pruning(self, head_index: int) -> None:
        super().record_pruning(head_index)
        newest = int(self.need_newest_head)
        if newest == head_index:
            self.need_newest_head.fill_(-1)
        elif newest > head_index:
            self.need_newest_head -= 1


# `gate_rule` -> its gate class (docs/growth_gate.md, 'Rules as objects').
GATE_RULE_CLASSES: dict[str, type[IncrtGate]] = {
    "max_only": MaxOnlyGate,
    "bidirectional": BidirectionalGate,
    "need": NeedGate,
}


def build_gate(config, layer_index: int) -> IncrtGate:
    """The gate of layer `layer_index` under `config.gate_rule`."""
    return GATE_RULE_CLASSES[config.gate_rule](config, layer_index)


def layer_second_moments(
    hidden_states: tuple[torch.Tensor, ...], attention_mask: torch.Tensor | None, num_tokens: int
) -> list[torch.Tensor]:
    """C_l = X_l^T X_l / N for every layer's input X_l = hidden_states[l] (all but the last), float32, on N =
    `num_tokens` (at most: the batch's) real tokens evenly spaced over the batch."""
    first = hidden_states[0]
    if attention_mask is None:
        token_mask = torch.ones(first.shape[:2], dtype=torch.bool, device=first.device)
    else:
        token_mask = attention_mask.to(first.device) != 0
    positions = token_mask.flatten().nonzero().squeeze(1)
    if positions.shape[0] == 0:
        raise ValueError("a gate check needs at least one real token: the batch is empty or fully padded")
    count = min(num_tokens, positions.shape[0])
    spaced = torch.linspace(0, positions.shape[0] - 1, count, device=first.device).round().long()
    chosen = positions[spaced]
    moments = []
    with torch.autocast(first.device.type, enabled=False):  # float32 even under autocast
        for layer_input in hidden_states[:-1]:
            tokens = layer_input.reshape(-1, layer_input.shape[-1])[chosen].float()
            moments.append(tokens.T @ tokens / count)
    return moments


# ---------------------------------------------------------------------------------------------------------
# Growth API
# ---------------------------------------------------------------------------------------------------------


class HeadGrowthMixin:
    """The growth API of `DDCLIncrtPreTrainedModel` (docs/ddcl_incrt.md, 'Growth and pruning'): grow, prune
    and resize the heads of its layers' attention, and run their gates; `config.num_heads` follows every
    change. `IncrtGrowthCallback` (training/growth.py) drives it inside a `Trainer`; it can also be called by
    hand. Needs `base_model.layers[l].attention` with `heads`, `gate`, `stacked` and `new_head()`, and the
    model's `_init_weights` for new heads."""

    def _attention(self, layer: int) -> nn.Module:
        num_layers = len(self.base_model.layers)
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < num_layers:
            raise ValueError(f"`layer` must be an int in [0, {num_layers}), got {layer!r}")
        return self.base_model.layers[layer].attention

    def _record_head_count(self, layer: int) -> None:
        num_heads = list(self.config.num_heads)
        num_heads[layer] = len(self._attention(layer).heads)
        self.config.num_heads = num_heads

    @torch.no_grad()
    def grow_head(
        self,
        layer: int,
        direction: torch.Tensor | None = None,
        *,
        function_preserving: bool = True,
        prototypes_from: int | None = None,
    ) -> nn.Module:
        """Append a head to `layer` and return it (INCRT growth). Function-preserving by default: its
        o_proj starts at zero, so the logits do not change, while o_proj's gradient is non-zero
        (`function_preserving=False`: o_proj keeps the model's initialisation, as a static model's head).
        With `direction` (a vector in R^hidden, normalised here) the head's first query/key rows point
        along it and the direction joins the layer gate's deflation basis. With `prototypes_from` (a head
        index of the layer) its prototype bank (prototypes and temperature) starts as a copy of that
        head's."""
        attention = self._attention(layer)
        if len(attention.heads) >= self.config.max_heads:
            raise ValueError(f"layer {layer} already has `max_heads` = {self.config.max_heads} heads")
        unit = None
        if direction is not None:
            if not isinstance(direction, torch.Tensor) or direction.shape != (self.config.hidden_size,):
                raise ValueError(
                    f"`direction` must be a tensor of shape ({self.config.hidden_size},), got "
                    f"{getattr(direction, 'shape', type(direction).__name__)}"
                )
            norm = direction.double().norm()
            if not torch.isfinite(norm) or norm < 1e-8:
                raise ValueError("`direction` must be finite and non-zero")
            unit = (direction.double() / norm).float().to(attention.gate.basis.device)
        if not isinstance(function_preserving, bool):
            raise TypeError(f"`function_preserving` must be a bool, got {function_preserving!r}")
        num_heads = len(attention.heads)
        if prototypes_from is not None and (
            isinstance(prototypes_from, bool)
            or not isinstance(prototypes_from, int)
            or not 0 <= prototypes_from < num_heads
        ):
            raise ValueError(
                f"`prototypes_from` must be None or a head index in [0, {num_heads}) of layer {layer}, got "
                f"{prototypes_from!r}"
            )
        head = attention.new_head()
        head.apply(self._init_weights)
        if function_preserving:
            head.o_proj.weight.zero_()
        if prototypes_from is not None:
            donor = attention.heads[prototypes_from].prototype_bank
            head.prototype_bank.prototypes.copy_(donor.prototypes)
            head.prototype_bank.rho.copy_(donor.rho)
        if unit is not None:
            head.align_with(unit)
        attention.heads.append(head)
        attention.gate.record_growth(len(attention.heads) - 1, unit)
        self._record_head_count(layer)
        return head

    @torch.no_grad()
    def prune_head(self, layer: int, head: int) -> nn.Module:
        """Remove head `head` of `layer` and return it; the output loses exactly that head's contribution."""
        attention = self._attention(layer)
        num_heads = len(attention.heads)
        if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < num_heads:
            raise ValueError(f"`head` must be an int in [0, {num_heads}) for layer {layer}, got {head!r}")
        if num_heads == 1:
            raise ValueError(f"cannot prune the last remaining head of layer {layer}")
        removed = attention.heads[head]
        del attention.heads[head]
        attention.gate.record_pruning(head)
        self._record_head_count(layer)
        return removed

    def resize_heads(self, num_heads: int | list[int]) -> None:
        """Grow (no direction) or prune to the given per-layer counts; pruning removes the last heads first
        (the most recently grown)."""
        num_layers = len(self.base_model.layers)
        max_heads = self.config.max_heads
        targets = num_heads
        if isinstance(num_heads, int) and not isinstance(num_heads, bool):
            targets = [num_heads] * num_layers
        if not isinstance(targets, (list, tuple)) or len(targets) != num_layers:
            raise ValueError(f"`num_heads` must be an int or a list of {num_layers} ints, got {num_heads!r}")
        for layer, target in enumerate(targets):
            if isinstance(target, bool) or not isinstance(target, int) or not 1 <= target <= max_heads:
                raise ValueError(f"`num_heads[{layer}]` must be an int in [1, {max_heads}], got {target!r}")
        for layer, target in enumerate(targets):
            heads = self._attention(layer).heads
            while len(heads) < target:
                self.grow_head(layer)
            while len(heads) > target:
                self.prune_head(layer, len(heads) - 1)

    @torch.no_grad()
    def gate_second_moments(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        *,
        num_tokens: int = DEFAULT_GATE_TOKENS,
    ) -> list[torch.Tensor]:
        """C_l = X_l^T X_l / N for every layer's input X_l (eval mode, no dropout), on N = `num_tokens` (at
        most: the batch's) real tokens evenly spaced over the batch. Several processes can average these
        before `gate_check`."""
        check_number("num_tokens", num_tokens, 2, MAX_SIZE, integer=True)
        was_training = self.training
        self.eval()
        try:
            outputs = self.base_model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                inputs_embeds=inputs_embeds,
                output_hidden_states=True,
                return_dict=True,
            )
        finally:
            self.train(was_training)
        return layer_second_moments(outputs.hidden_states, attention_mask, num_tokens)

    @torch.no_grad()
    def gate_check(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        second_moments: list[torch.Tensor] | None = None,
        *,
        num_tokens: int = DEFAULT_GATE_TOKENS,
        tracker_steps: int = DEFAULT_TRACKER_STEPS,
        need: list[NeedEvidence] | None = None,
    ) -> list[GateDecision]:
        """One INCRT gate check per layer, on a batch (`num_tokens` of its tokens: `gate_second_moments`) or
        on precomputed `second_moments` (one d x d matrix per layer, e.g. averaged over processes): each
        layer's gate observes its matrices with at most `tracker_steps` tracker iterations and decides.
        Updates the gate state and applies nothing: act on the decisions with `prune_head` and
        `grow_head(layer, decision.direction, function_preserving=decision.function_preserving,
        prototypes_from=decision.prototypes_from)`. `need`: one `NeedEvidence` per layer
        (`need_test.need_evidence`), which `gate_rule="need"` decides on. An empty batch or non-finite
        matrices raise ValueError and leave every layer's gate as it was."""
        check_number("tracker_steps", tracker_steps, 1, MAX_SIZE, integer=True)
        if second_moments is None:
            second_moments = self.gate_second_moments(
                input_ids, attention_mask, token_type_ids, inputs_embeds, num_tokens=num_tokens
            )
        layers = self.base_model.layers
        hidden = self.config.hidden_size
        if len(second_moments) != len(layers) or any(
            not isinstance(m, torch.Tensor) or m.shape != (hidden, hidden) for m in second_moments
        ):
            raise ValueError(
                f"`second_moments` must hold {len(layers)} matrices of shape ({hidden}, {hidden})"
            )
        if not all(bool(torch.isfinite(m).all()) for m in second_moments):
            raise ValueError("`second_moments` must be finite (non-finite ones would corrupt the gate state)")
        if need is not None and (
            len(need) != len(layers)
            or not all(isinstance(e, NeedEvidence) and all(map(math.isfinite, e)) for e in need)
        ):
            raise ValueError(f"`need` must hold {len(layers)} finite `NeedEvidence`, one per layer")
        gates = [layer.attention.gate for layer in layers]
        saved = [{name: buffer.clone() for name, buffer in gate.named_buffers()} for gate in gates]
        try:
            decisions = []
            for index, (layer, moment) in enumerate(zip(layers, second_moments, strict=True)):
                gate = layer.attention.gate
                observation = gate.observe(
                    *_gate_inputs(layer.attention, moment),
                    tracker_steps=tracker_steps,
                    need=None if need is None else need[index],
                )
                decisions.append(gate.decide(observation))
            return decisions
        except ValueError:  # a later layer's check failed: no layer keeps a half-done check
            for gate, state in zip(gates, saved, strict=True):
                for name, buffer in gate.named_buffers():
                    buffer.copy_(state[name])
            raise


def _gate_inputs(
    attention: nn.Module, second_moment: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a layer's gate observes: C = X^T X / N of its input, M_a and the per-head energies of its heads,
    in float32 even under autocast."""
    with torch.autocast(second_moment.device.type, enabled=False):
        query_weights = attention.stacked("q_proj").float()
        key_weights = attention.stacked("k_proj").float()
        second_moment = second_moment.float()
        return (
            second_moment,
            directional_matrix(query_weights, key_weights),
            head_directional_energy(second_moment, query_weights, key_weights),
        )

"""Analysis of a growth run: the INCRT head-count law (from the gate's trajectory and from one exact
spectrum), the grow order, how growth ended, and the local/global split of the temperatures."""

from __future__ import annotations

import math

from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtPreTrainedModel


def head_count_law(history: dict) -> list[dict]:
    """INCRT head-count law K* = kappa_T^2 log(Gamma_res^(0) / theta_w) per layer from the gate's trajectory,
    against the observed heads (`spectrum_head_count_law` is the estimator on one exact spectrum).

    The Theta() constant is taken as 1; the papers do not say how to estimate kappa_T, so from the run:

    * Gamma_res^(0): lambda_max(A_res) at the layer's first gate check in `history["checks"]` (after
      calibration); theta_w: its threshold;
    * lambda_1, ..., lambda_n: lambda_max(A_res) at the layer's n grow events; lambda_end: at its first stop
      or full verdict (its last check if there is none);
    * per-head contraction rho = (lambda_end / lambda_1)^(1/n), kappa_T^2 = 1 / (1 - rho): a residual
      shrinking by the factor (1 - 1/kappa_T^2) per head reaches theta_w after about
      kappa_T^2 log(Gamma_res^(0) / theta_w) heads (`predicted_heads`, `ratio` = predicted / observed).

    The lambdas are measured at different steps, while W_Q, W_K learn, so they only approximate one spectrum.
    Fields are None where undefined: no check, no head grown, Gamma_res^(0) <= theta_w, or rho >= 1.
    """
    layers = []
    for layer, observed in enumerate(history["num_heads"]):
        checks = [check for check in history["checks"] if check["action"][layer] != "calibrating"]
        events = [event for event in history["events"] if event["layer"] == layer]
        grown = [event["lambda_max"] for event in events if event["action"] == "grow"]
        stops = [event["lambda_max"] for event in events if event["action"] in ("stop", "full")]
        record = {
            "layer": layer,
            "observed_heads": observed,
            "initial_heads": history["initial_num_heads"][layer],
            "grow_lambdas": grown,
            "gamma_res0": None,
            "theta_w": None,
            "lambda_end": None,
            "rho": None,
            "kappa_T": None,
            "predicted_heads": None,
            "ratio": None,
        }
        layers.append(record)
        if not checks:
            continue
        gamma, theta = checks[0]["lambda_max"][layer], checks[0]["theta_w"][layer]
        end = stops[0] if stops else checks[-1]["lambda_max"][layer]
        record.update(gamma_res0=gamma, theta_w=theta, lambda_end=end)
        if not (grown and gamma > theta > 0 and grown[0] > 0):
            continue
        record["rho"] = (max(end, 0.0) / grown[0]) ** (1 / len(grown))
        if record["rho"] < 1:
            record["kappa_T"] = math.sqrt(1 / (1 - record["rho"]))
            record["predicted_heads"] = record["kappa_T"] ** 2 * math.log(gamma / theta)
            record["ratio"] = record["predicted_heads"] / observed
    return layers


def theta_at_growth_start(history: dict, model: DDCLIncrtPreTrainedModel) -> list[float]:
    """theta_w per layer at the first growth check: the calibrated value, or the "relative" threshold on the
    spectrum growth started from (the gates' current theta_w when no check ran)."""
    if history["checks"]:
        return list(history["checks"][0]["theta_w"])
    return [float(layer.attention.gate.theta_w) for layer in model.base_model.layers]


def spectrum_head_count_law(
    spectra: list[list[float]], theta_w: list[float], observed_heads: list[int]
) -> list[dict]:
    """INCRT head-count law on one exact spectrum per layer (e.g. `gate_spectrum` when growth starts): the
    captured spectrum is the eigenvalues above theta_w, lambda_1 >= ... >= lambda_m (m = the heads a gate
    acting on this one spectrum would grow), Gamma_res^(0) = lambda_1, kappa_T = lambda_1 / lambda_m (the
    condition number of the captured spectrum) and K* = kappa_T^2 log(lambda_1 / theta_w); K* = 0 when
    m = 0. `ratio` = K* / observed heads."""
    for name, values in (("theta_w", theta_w), ("observed_heads", observed_heads)):
        if len(values) != len(spectra):
            raise ValueError(f"`{name}` needs one entry per layer ({len(spectra)}), got {len(values)}")
    layers = []
    rows = zip(spectra, theta_w, observed_heads, strict=True)
    for layer, (eigenvalues, theta, observed) in enumerate(rows):
        captured = [value for value in eigenvalues if value > theta]
        record = {
            "layer": layer,
            "observed_heads": observed,
            "theta_w": theta,
            "captured_eigenvalues": captured,
            "gamma_res0": captured[0] if captured else None,
            "kappa_T": None,
            "predicted_heads": 0.0,
            "ratio": 0.0,
        }
        if captured and theta > 0:
            record["kappa_T"] = captured[0] / captured[-1]
            record["predicted_heads"] = record["kappa_T"] ** 2 * math.log(captured[0] / theta)
            record["ratio"] = record["predicted_heads"] / observed
        layers.append(record)
    return layers


def grow_order(history: dict) -> list[dict]:
    """Per layer: lambda_max at successive grow events and whether they decrease (INCRT: heads are added in
    decreasing eigenvalue order); `decreasing_pairs` counts consecutive pairs with lambda_{i+1} < lambda_i."""
    layers = []
    for layer in range(len(history["num_heads"])):
        lambdas = [
            event["lambda_max"]
            for event in history["events"]
            if event["layer"] == layer and event["action"] == "grow"
        ]
        pairs = list(zip(lambdas, lambdas[1:], strict=False))
        layers.append(
            {
                "layer": layer,
                "grow_lambdas": lambdas,
                "pairs": len(pairs),
                "decreasing_pairs": sum(later < earlier for earlier, later in pairs),
                "decreasing": all(later < earlier for earlier, later in pairs),
            }
        )
    return layers


def stop_summary(history: dict) -> list[dict]:
    """Per layer: how growth ended: "stop" (lambda_max <= theta_w: a finite stop), "full" (max_heads) or
    None (still growing at the end), with the step."""
    layers = []
    for layer in range(len(history["num_heads"])):
        ends = [e for e in history["events"] if e["layer"] == layer and e["action"] in ("stop", "full")]
        layers.append(
            {
                "layer": layer,
                "verdict": ends[0]["action"] if ends else None,
                "step": ends[0]["step"] if ends else None,
                "lambda_max": ends[0]["lambda_max"] if ends else None,
                "theta_w": ends[0]["theta_w"] if ends else None,
            }
        )
    return layers


def heads_at_factor(history: dict, factor: float, run_factor: float) -> list[dict]:
    """Per layer: the heads a run of the default rule (max_only, relative theta_w) would have ended with at
    `gate_calibration_factor` = `factor` >= `run_factor` (the run's), read off the run's checks
    (docs/growth_gate.md, "Why the gate's count does not follow the task").

    theta_w = factor x ||A_sym||_F, and a check records lambda_max and theta_w = run_factor x ||A_sym||_F, so
    its ratio lambda_max / ||A_sym||_F = run_factor x lambda_max / theta_w. A higher factor changes no
    verdict before the first settled check (grow or stop) whose ratio is <= factor: it stops there, with the
    heads the layer had before that check (`heads`, `step`). Pending checks (trackers not converged) are
    skipped; with the higher floor factor x ||A_sym||_F one of them may have settled into a stop earlier,
    so `heads_if_pending_stop` counts a pending check with ratio <= factor as a stop (a lower bound).
    A layer whose checks never fall to the factor keeps the run's end (`step` None).
    """
    if not factor >= run_factor > 0:
        raise ValueError(
            f"factor must be >= run_factor > 0 (a lower factor grows beyond the run), got {factor}"
        )
    layers = []
    for layer, initial in enumerate(history["initial_num_heads"]):
        heads, bound, step = initial, None, None
        for check in history["checks"]:
            action = check["action"][layer]
            if action == "calibrating":
                continue
            ratio = run_factor * check["lambda_max"][layer] / check["theta_w"][layer]
            if ratio <= factor and action == "pending" and bound is None:
                bound = heads
            if ratio <= factor and action in ("grow", "stop", "full"):
                step = check["step"]
                break
            heads = check["num_heads"][layer]
        layers.append(
            {
                "layer": layer,
                "heads": heads,
                "heads_if_pending_stop": heads if bound is None else bound,
                "step": step,
            }
        )
    return layers


def temperature_split(temperatures: list[list[float]], tau_min: float, tau_init: float) -> list[dict]:
    """Per layer: heads are "local" when tau moved more than halfway from tau_init to tau_min
    (tau - tau_min < (tau_init - tau_min) / 2: sharp, near-hard assignment), "global" otherwise
    (docs/ddcl_incrt.md, 'Temperatures')."""
    midpoint = tau_min + (tau_init - tau_min) / 2
    return [
        {
            "layer": layer,
            "temperatures": taus,
            "local_heads": [h for h, tau in enumerate(taus) if tau < midpoint],
            "global_heads": [h for h, tau in enumerate(taus) if tau >= midpoint],
            "threshold": midpoint,
        }
        for layer, taus in enumerate(temperatures)
    ]

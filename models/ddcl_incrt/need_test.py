"""The need test of `gate_rule="need"` (docs/growth_gate.md, 'The need rule'): would one more head lower the
held-out loss and the held-out error?

A head added to layer l whose attention is still spread evenly over the tokens adds, at every position, a
linear map of f_l = the mean of the layer's input over real tokens. Whether the classifier could use it is
asked of two multinomial logistic probes on the gate batch, fitted on one half and scored on the other (both
ways, so every row is scored once, by a probe that did not see it):

    r        the representation the classifier reads (the pooled last hidden state)
    l_i(r)   held-out cross-entropy of row i under a probe of r
    delta_i  = l_i(r) - l_i([r, f_l])
    t        = mean(delta) / (std(delta) / sqrt(N)),    gain = mean(delta) / mean(l(r))
    e(r)     held-out classification error (mean 0/1 error of the argmax) of the probe of r, on the same rows
    error_drop = e(r) - e([r, f_l]),   error_t: the t statistic of its per-row differences

A probe reads what is linearly there, so a feature the classifier already has (or that only overfits) gives
no held-out drop. The gradient of the loss with respect to a new head's output projection cannot show the
need: where the classifier has no weights for what is missing, that gradient is zero (a saddle).

Adoption of the newest grown head: rise = (task loss with that head's output removed) - (task loss).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from geoformers.models.ddcl_incrt.incrt import NeedEvidence, NeedGate, layer_second_moments
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification

PROBE_WEIGHT_DECAY = 1e-3  # L2 on the probe's weights over standardised features
PROBE_ITERATIONS = 25  # L-BFGS iterations per probe fit
FEATURE_STD_FLOOR = 1e-6


def probe_scores(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    num_classes: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row cross-entropy and 0/1 error of the argmax on the test rows of a multinomial logistic probe
    fitted on the train rows (features standardised with the train rows' mean and std, L2
    `PROBE_WEIGHT_DECAY`, L-BFGS), both float64."""
    train_features, test_features = train_features.double(), test_features.double()
    mean = train_features.mean(0)
    std = train_features.std(0).clamp_min(FEATURE_STD_FLOOR)
    train_features, test_features = (train_features - mean) / std, (test_features - mean) / std
    weight = torch.zeros(train_features.shape[1], num_classes, dtype=torch.float64)
    bias = torch.zeros(num_classes, dtype=torch.float64)
    weight.grad, bias.grad = torch.zeros_like(weight), torch.zeros_like(bias)
    targets = F.one_hot(train_labels, num_classes).double()
    rows = train_features.shape[0]
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=PROBE_ITERATIONS, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        """The penalised cross-entropy and its gradient by hand (no autograd graph: a third of the time)."""
        log_probabilities = torch.log_softmax(train_features @ weight + bias, 1)
        residual = (log_probabilities.exp() - targets) / rows
        weight.grad.copy_(train_features.T @ residual + 2 * PROBE_WEIGHT_DECAY * weight)
        bias.grad.copy_(residual.sum(0))
        return -(targets * log_probabilities).sum() / rows + PROBE_WEIGHT_DECAY * weight.pow(2).sum()

    with torch.no_grad():
        optimizer.step(closure)
        logits = test_features @ weight + bias
        errors = (logits.argmax(1) != test_labels).double()
        return F.cross_entropy(logits, test_labels, reduction="none"), errors


def held_out_scores(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row held-out probe losses and 0/1 errors, each (N,): rows of the first half scored by a probe
    fitted on the second, and the reverse."""
    half = features.shape[0] // 2
    first, second = slice(0, half), slice(half, None)
    scored = [
        probe_scores(features[second], labels[second], features[first], labels[first], num_classes),
        probe_scores(features[first], labels[first], features[second], labels[second], num_classes),
    ]
    return torch.cat([scored[0][0], scored[1][0]]), torch.cat([scored[0][1], scored[1][1]])


def paired_drop(without: torch.Tensor, with_feature: torch.Tensor) -> tuple[float, float]:
    """(t, gain) of the per-row drop delta = without - with_feature (module docstring); t = 0 when every
    delta is equal (no spread to test against)."""
    delta = without - with_feature
    spread = float(delta.std())
    mean = float(delta.mean())
    t = mean / (spread / math.sqrt(delta.shape[0])) if spread > 0 else 0.0
    return t, mean / max(float(without.mean()), FEATURE_STD_FLOOR)


def _masked_mean(hidden: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    weights = token_mask[..., None].to(torch.float64)
    return (hidden.double() * weights).sum(1) / weights.sum(1).clamp_min(1.0)


def _check_need_inputs(model, labels) -> int:
    """The number of classes, after refusing what the need test cannot read."""
    if not isinstance(model, DDCLIncrtForSequenceClassification):
        raise TypeError(
            f"the need test reads a classifier: `model` must be a DDCLIncrtForSequenceClassification, got "
            f"{type(model).__name__}"
        )
    num_classes = model.config.num_labels
    if num_classes < 2 or model.config.problem_type not in (None, "single_label_classification"):
        raise ValueError(
            "the need test needs single-label classification (`num_labels` >= 2, class-index `labels`), "
            f"got num_labels={num_classes}, problem_type={model.config.problem_type!r}"
        )
    if not isinstance(labels, torch.Tensor) or labels.dim() != 1 or labels.dtype.is_floating_point:
        raise ValueError("the need test needs `labels`: a 1-d tensor of class indices, one per row")
    if bool(((labels < 0) | (labels >= num_classes)).any()):
        raise ValueError(f"`labels` must be class indices in [0, {num_classes}) (no ignored rows)")
    return num_classes


class TaskScores(NamedTuple):
    """The model's own scores on a labelled batch (`task_scores`)."""

    loss: float  # cross-entropy
    error: float  # 0/1 error of the argmax
    moments: list[torch.Tensor] | None  # every layer's C = X^T X / N, with `num_tokens`


@torch.no_grad()
def task_scores(
    model,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
    *,
    num_tokens: int | None = None,
) -> TaskScores:
    """The model's cross-entropy and classification error on a labelled batch in eval mode (the need rule's
    plateau monitor); with `num_tokens`, also every layer's C = X^T X / N from the same forward
    (`layer_second_moments`)."""
    _check_need_inputs(model, labels)
    was_training = model.training
    model.eval()
    try:
        outputs = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            inputs_embeds=inputs_embeds,
            output_hidden_states=num_tokens is not None,
        )
    finally:
        model.train(was_training)
    logits, labels = outputs.logits.double(), labels.to(outputs.logits.device)
    moments = None
    if num_tokens is not None:
        moments = layer_second_moments(outputs.hidden_states, attention_mask, num_tokens)
    return TaskScores(
        float(F.cross_entropy(logits, labels)), float((logits.argmax(1) != labels).double().mean()), moments
    )


@torch.no_grad()
def need_evidence(
    model,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
    *,
    loss: float | None = None,
    fit_error: float | None = None,
    plateau_loss: float | None = None,
    probe_rows: dict | Callable[[], dict] | None = None,
) -> list[NeedEvidence]:
    """Every layer's `NeedEvidence` (module docstring), in eval mode: the task loss `loss` and the model's
    error `fit_error` on this labelled batch (both computed when `loss` is None; a given `loss` without
    `fit_error` counts as unfitted, error 1), the loss rise on this batch when the layer's newest grown
    head (its gate's `need_newest_head`) is removed, and the probe test on `probe_rows` (a labelled batch,
    or a callable that returns one, called at most once; default: this batch). Under `NeedGate` the
    plateau test reads `plateau_loss` (default `loss`; e.g. averaged over processes): the removal only at a
    plateau (rise 0 while the loss moves, `NeedGate.phase`), and the probes only where the verdict reads
    them (`NeedGate.reads_probe`, else t, gain and the errors are 0). `model`: a
    `DDCLIncrtForSequenceClassification` with class labels; the probe rows need at least 4 rows (two
    probe halves of 2)."""
    _check_need_inputs(model, labels)
    inputs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
        "inputs_embeds": inputs_embeds,
    }
    if loss is None:
        loss, fit_error, _ = task_scores(model, **inputs, labels=labels)
    fit_error = 1.0 if fit_error is None else fit_error
    plateau_loss = loss if plateau_loss is None else plateau_loss
    was_training = model.training
    model.eval()
    try:
        probe = None
        evidence = []
        for index, layer in enumerate(model.base_model.layers):
            gate = layer.attention.gate
            rule = isinstance(gate, NeedGate)
            unsettled = rule and gate.settling(plateau_loss, 0.0) in ("first", "moving")  # no rise is read
            if rule and unsettled and not gate.reads_probe(plateau_loss, 0.0, fit_error):
                evidence.append(NeedEvidence.unprobed(plateau_loss, 0.0, fit_error))  # nothing else is read
                continue
            rise = 0.0 if unsettled else _removal_rise(model, layer, inputs, labels, loss)
            if rule and not gate.reads_probe(plateau_loss, rise, fit_error):
                evidence.append(NeedEvidence.unprobed(plateau_loss, rise, fit_error))  # no probe is read
                continue
            if probe is None:
                rows = probe_rows() if callable(probe_rows) else probe_rows
                probe = _ProbeFeatures(model, {**inputs, "labels": labels} if rows is None else rows)
            t, gain, error, error_with, error_t = probe.test(index)
            evidence.append(
                NeedEvidence(
                    plateau_loss, t, gain, rise, error, error_with, error - error_with, error_t, fit_error
                )
            )
    finally:
        model.train(was_training)
    return evidence


class _ProbeFeatures:
    """The probe rows' readout r and per-layer token-mean inputs f_l (one forward, eval mode), and the
    held-out losses and errors of the probe of r alone, fitted once for every layer's test."""

    def __init__(self, model, rows: dict):
        labels = rows.get("labels")
        self.num_classes = _check_need_inputs(model, labels)
        if labels.shape[0] < 4:
            raise ValueError(f"the need test needs at least 4 labelled rows, got {labels.shape[0]}")
        inputs = {
            name: rows.get(name)
            for name in ("input_ids", "attention_mask", "token_type_ids", "inputs_embeds")
        }
        captured = {}
        handle = model.classifier.register_forward_pre_hook(
            lambda module, args: captured.update(readout=args[0])
        )
        try:
            hidden_states = model(**inputs, output_hidden_states=True).hidden_states
        finally:
            handle.remove()
        first = hidden_states[0]
        mask = inputs["attention_mask"]
        token_mask = (
            torch.ones(first.shape[:2], dtype=torch.bool, device=first.device)
            if mask is None
            else (mask.to(first.device) != 0)
        )
        self.layer_means = [_masked_mean(hidden, token_mask) for hidden in hidden_states[:-1]]
        self.readout = captured["readout"].double()
        self.labels = labels.to(first.device)
        self.without, self.errors = held_out_scores(self.readout, self.labels, self.num_classes)

    def test(self, layer: int) -> tuple[float, float, float, float, float]:
        """(t, gain) of adding layer `layer`'s token-mean input to the readout (`paired_drop`), the held-out
        errors of the probes without and with it, and the t statistic of the per-row error drop."""
        features = torch.cat([self.readout, self.layer_means[layer]], 1)
        losses, errors = held_out_scores(features, self.labels, self.num_classes)
        error_t, _ = paired_drop(self.errors, errors)
        return (*paired_drop(self.without, losses), float(self.errors.mean()), float(errors.mean()), error_t)


def _removal_rise(model, layer, inputs: dict, labels: torch.Tensor, loss: float) -> float:
    """Task loss with the layer's newest grown head's output removed, minus `loss` (0 without such a head)."""
    newest = int(getattr(layer.attention.gate, "need_newest_head", -1))  # -1 under the spectral rules
    if newest < 0:
        return 0.0
    handle = layer.attention.heads[newest].o_proj.register_forward_hook(
        lambda module, args, output: torch.zeros_like(output)
    )
    try:
        logits = model(**inputs).logits
    finally:
        handle.remove()
    return float(F.cross_entropy(logits.double(), labels.to(logits.device))) - loss


__all__ = ["TaskScores", "held_out_scores", "need_evidence", "paired_drop", "probe_scores", "task_scores"]

"""The need test of `gate_rule="need"` (docs/growth_gate.md, 'The need rule'): would one more head lower the
held-out loss?

A head added to layer l whose attention is still spread evenly over the tokens adds, at every position, a
linear map of f_l = the mean of the layer's input over real tokens. Whether the classifier could use it is
asked of two multinomial logistic probes on the gate batch, fitted on one half and scored on the other (both
ways, so every row is scored once, by a probe that did not see it):

    r        the representation the classifier reads (the pooled last hidden state)
    l_i(r)   held-out cross-entropy of row i under a probe of r
    delta_i  = l_i(r) - l_i([r, f_l])
    t        = mean(delta) / (std(delta) / sqrt(N)),    gain = mean(delta) / mean(l(r))

A probe reads what is linearly there, so a feature the classifier already has (or that only overfits) gives
no held-out drop. The gradient of the loss with respect to a new head's output projection cannot show the
need: where the classifier has no weights for what is missing, that gradient is zero (a saddle).

Adoption of the newest grown head: rise = (task loss with that head's output removed) - (task loss).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from geoformers.models.ddcl_incrt.incrt import NeedEvidence, NeedGate
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification

PROBE_WEIGHT_DECAY = 1e-3  # L2 on the probe's weights over standardised features
PROBE_ITERATIONS = 50  # L-BFGS iterations per probe fit
FEATURE_STD_FLOOR = 1e-6


def probe_losses(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    num_classes: int,
) -> torch.Tensor:
    """Per-row cross-entropy on the test rows of a multinomial logistic probe fitted on the train rows
    (features standardised with the train rows' mean and std, L2 `PROBE_WEIGHT_DECAY`, L-BFGS), float64."""
    train_features, test_features = train_features.double(), test_features.double()
    mean = train_features.mean(0)
    std = train_features.std(0).clamp_min(FEATURE_STD_FLOOR)
    train_features, test_features = (train_features - mean) / std, (test_features - mean) / std
    weight = torch.zeros(train_features.shape[1], num_classes, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(num_classes, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=PROBE_ITERATIONS, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        logits = train_features @ weight + bias
        loss = F.cross_entropy(logits, train_labels) + PROBE_WEIGHT_DECAY * weight.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    with torch.no_grad():
        return F.cross_entropy(test_features @ weight + bias, test_labels, reduction="none")


def held_out_losses(features: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Per-row held-out probe losses (N,): rows of the first half scored by a probe fitted on the second, and
    the reverse."""
    half = features.shape[0] // 2
    first, second = slice(0, half), slice(half, None)
    return torch.cat(
        [
            probe_losses(features[second], labels[second], features[first], labels[first], num_classes),
            probe_losses(features[first], labels[first], features[second], labels[second], num_classes),
        ]
    )


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
    if labels.shape[0] < 4:
        raise ValueError(f"the need test needs at least 4 labelled rows, got {labels.shape[0]}")
    if bool(((labels < 0) | (labels >= num_classes)).any()):
        raise ValueError(f"`labels` must be class indices in [0, {num_classes}) (no ignored rows)")
    return num_classes


@torch.no_grad()
def task_loss(
    model,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
) -> float:
    """The model's cross-entropy on a labelled batch in eval mode (the need rule's plateau monitor)."""
    _check_need_inputs(model, labels)
    was_training = model.training
    model.eval()
    try:
        logits = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            inputs_embeds=inputs_embeds,
        ).logits
    finally:
        model.train(was_training)
    return float(F.cross_entropy(logits.double(), labels.to(logits.device)))


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
) -> list[NeedEvidence]:
    """Every layer's `NeedEvidence` on a labelled batch (module docstring), in eval mode: the task loss
    `loss` (the plateau monitor's, e.g. `task_loss` on rows fixed across checks; default this batch's), the
    probe test on the layer's token-mean input, and the loss rise on this batch when the layer's newest grown
    head (its gate's `need_newest_head`) is removed; under `NeedGate` the removal only at a plateau (0
    while `NeedGate.moving`) and the probes only where the verdict reads them (`NeedGate.reads_probe`, else
    t and gain are 0). `model`: a `DDCLIncrtForSequenceClassification` with class labels; the batch
    needs at least 4 rows (two probe halves of 2)."""
    num_classes = _check_need_inputs(model, labels)
    inputs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
        "inputs_embeds": inputs_embeds,
    }
    layers = model.base_model.layers
    captured: dict[int | str, torch.Tensor] = {}

    def keep_input(key):
        def hook(module, args, kwargs):
            captured[key] = args[0] if args else kwargs["hidden_states"]

        return hook

    handles = [
        layer.register_forward_pre_hook(keep_input(i), with_kwargs=True) for i, layer in enumerate(layers)
    ]
    handles.append(model.classifier.register_forward_pre_hook(keep_input("readout"), with_kwargs=True))
    was_training = model.training
    model.eval()
    try:
        logits = model(**inputs).logits
        labels = labels.to(logits.device)
        batch_loss = float(F.cross_entropy(logits.double(), labels))
        loss = batch_loss if loss is None else loss
        for handle in handles:
            handle.remove()
        handles = []
        first = captured[0]
        if attention_mask is None:
            token_mask = torch.ones(first.shape[:2], dtype=torch.bool, device=first.device)
        else:
            token_mask = attention_mask.to(first.device) != 0
        readout = captured["readout"].double()
        without = None
        evidence = []
        for index, layer in enumerate(layers):
            gate = layer.attention.gate
            rule = isinstance(gate, NeedGate)
            if rule and gate.moving(loss):
                evidence.append(NeedEvidence(loss, 0.0, 0.0, 0.0))  # still moving: nothing else is read
                continue
            rise = _removal_rise(model, layer, inputs, labels, batch_loss)
            if rule and not gate.reads_probe(loss, rise):
                evidence.append(NeedEvidence(loss, 0.0, 0.0, rise))  # the verdict will not read the probe
                continue
            if without is None:
                without = held_out_losses(readout, labels, num_classes)
            feature = _masked_mean(captured[index], token_mask)
            t, gain = paired_drop(
                without, held_out_losses(torch.cat([readout, feature], 1), labels, num_classes)
            )
            evidence.append(NeedEvidence(loss, t, gain, rise))
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return evidence


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
    return float(F.cross_entropy(logits.double(), labels)) - loss


__all__ = ["held_out_losses", "need_evidence", "paired_drop", "probe_losses", "task_loss"]

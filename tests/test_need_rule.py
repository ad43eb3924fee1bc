"""The need rule (`gate_rule="need"`, docs/growth_gate.md, 'The need rule'): the held-out probe test against
hand computations and planted features, the rule's verdicts on hand-made evidence, the model and callback
plumbing, and bad input."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from growth_worker import tiny_model, training_args
from test_incrt_gate import gate_config, planted_problem
from transformers import Trainer

from geoformers.models.ddcl_incrt.incrt import NeedEvidence, NeedGate, build_gate
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtModel
from geoformers.models.ddcl_incrt.need_test import (
    held_out_scores,
    need_evidence,
    paired_drop,
    probe_scores,
    task_scores,
)
from geoformers.training import growth
from geoformers.training.growth import IncrtGrowthCallback
from geoformers.training.synthetic_tasks import build_majority_relations_task, build_spectral_task, task_spec


def test_paired_drop_is_the_t_statistic_and_relative_gain_of_the_per_row_drop():
    without = torch.tensor([2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    with_feature = torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=torch.float64)  # drops 1, 2, 3, 4
    t, gain = paired_drop(without, with_feature)
    std = math.sqrt(((1 - 2.5) ** 2 + (2 - 2.5) ** 2 + (3 - 2.5) ** 2 + (4 - 2.5) ** 2) / 3)
    assert t == pytest.approx(2.5 / (std / 2.0))
    assert gain == pytest.approx(2.5 / 3.5)
    assert paired_drop(without, without - 1.0) == (0.0, pytest.approx(1 / 3.5))  # no spread: t = 0


def _planted_features(rows: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    readout = torch.randn(rows, 6, generator=generator, dtype=torch.float64)
    feature = torch.randn(rows, 4, generator=generator, dtype=torch.float64)
    return readout, feature


def test_a_feature_that_carries_the_labels_gives_a_large_held_out_drop():
    readout, feature = _planted_features(256)
    labels = (feature[:, 0] > 0).long()  # in the feature, not in the readout
    without, errors = held_out_scores(readout, labels, 2)
    with_feature, errors_with = held_out_scores(torch.cat([readout, feature], 1), labels, 2)
    assert without.shape == (256,)
    assert without.mean() == pytest.approx(math.log(2), abs=0.1)  # the readout knows nothing
    t, gain = paired_drop(without, with_feature)
    assert t > 10 and gain > 0.5
    assert errors.mean() > 0.3 and errors_with.mean() < 0.1  # the accuracy follows: a need


def test_a_feature_that_carries_nothing_new_gives_no_held_out_drop():
    readout, feature = _planted_features(256, seed=1)
    labels = (readout[:, 0] + 0.3 * readout[:, 1] > 0).long()  # all in the readout already
    t, gain = paired_drop(
        held_out_scores(readout, labels, 2)[0],
        held_out_scores(torch.cat([readout, feature], 1), labels, 2)[0],
    )
    assert t < 3 and gain < 0.02


def test_probe_scores_count_the_argmax_errors_of_the_held_out_rows():
    """A probe fitted on x > 0 -> class 1 classifies every test row by the sign of x: each row's error is 1
    exactly where its test label disagrees with that sign."""
    features = torch.linspace(-2.0, 2.0, 40, dtype=torch.float64)[:, None]
    labels = (features[:, 0] > 0).long()
    test_labels = labels.clone()
    test_labels[:5] = 1 - test_labels[:5]  # five rows labelled against the sign
    losses, errors = probe_scores(features, labels, features, test_labels, 2)
    assert errors.tolist() == [1.0] * 5 + [0.0] * 35
    assert bool((losses[:5] > math.log(2)).all()) and bool((losses[5:] < math.log(2)).all())
    assert held_out_scores(features, labels, 2)[1].shape == (40,)


def test_a_feature_that_lowers_the_loss_but_not_the_error_is_no_need():
    """The readout already classifies every held-out row (a noisy copy of the label with margin 1 / 0.2 = 5
    standard deviations); a second noisy copy makes the probe surer (a large loss drop) but cannot lower an
    error of 0, so the gate stops (docs/growth_gate.md, 'The need rule')."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(256) % 2
    sign = (2 * labels - 1).double()[:, None]
    readout = sign + 0.2 * torch.randn(256, 1, generator=generator, dtype=torch.float64)
    feature = sign + 0.2 * torch.randn(256, 1, generator=generator, dtype=torch.float64)
    without, errors = held_out_scores(readout, labels, 2)
    with_feature, errors_with = held_out_scores(torch.cat([readout, feature], 1), labels, 2)
    t, gain = paired_drop(without, with_feature)
    assert t > 3 and gain > 0.02  # the loss alone would say "need"
    assert float(errors.sum()) == 0 and float(errors_with.sum()) == 0
    evidence = NeedEvidence(1.0, t, gain, 0.0, 0.0, 0.0, 0.0)
    gate = _need_gate()
    assert not gate.needs(evidence)
    assert gate.decide(_observation(gate, evidence)).action == "stop"  # the first probe stops at once


def test_the_error_drop_must_exceed_gate_need_error():
    """t and gain pass in every case; the error drop decides: 0.004 <= 0.005 is no need, 0.006 is one."""
    gate = _need_gate()
    assert gate.config.gate_need_error == 0.005
    gate.record_loss(1.0)
    assert gate.decide(_observation(gate, _evidence(1.0, 5.0, 0.3, 0.0, 0.104, 0.1))).action == "stop"
    gate = _need_gate()
    gate.record_loss(1.0)
    assert gate.decide(_observation(gate, _evidence(1.0, 5.0, 0.3, 0.0, 0.106, 0.1))).action == "grow"
    gate = _need_gate(gate_need_error=0.0)  # 0: any error drop counts, none does not
    gate.record_loss(1.0)
    assert gate.decide(_observation(gate, _evidence(1.0, 5.0, 0.3, 0.0, 0.1, 0.1))).action == "stop"


def test_a_significant_error_drop_is_a_need_where_the_loss_test_is_not():
    """A probe that overfits its cross-entropy (t < 3 on the loss) can still lower the held-out error by far
    more than `gate_need_error`: the per-row error drop's own t > `gate_need_t` makes it a need, a
    non-significant one (t <= 3) does not, and an error drop <= `gate_need_error` never does."""
    loss_says_no = {"loss": 1.0, "t": 1.9, "gain": 0.12, "rise": 0.0, "error": 0.51, "error_with": 0.28}
    gate = _need_gate()
    gate.record_loss(1.0)
    significant = NeedEvidence(**loss_says_no, error_drop=0.23, error_t=9.5)
    assert gate.decide(_observation(gate, significant)).action == "grow"
    gate = _need_gate()
    gate.record_loss(1.0)
    assert gate.decide(_observation(gate, significant._replace(error_t=2.9))).action == "stop"
    gate = _need_gate()
    gate.record_loss(1.0)
    tiny = significant._replace(error=0.104, error_with=0.1, error_drop=0.004, error_t=5.0)
    assert gate.decide(_observation(gate, tiny)).action == "stop"


def _evidence(loss, t, gain, rise, error=0.2, error_with=0.1, fit_error=1.0):
    """Hand-made evidence; by default the probe's held-out error drops by 0.1 (a need on the error) and the
    model does not fit its monitor rows."""
    return NeedEvidence(loss, t, gain, rise, error, error_with, error - error_with, fit_error=fit_error)


def _observation(gate, need: NeedEvidence, heads: int = 1):
    second_moment, directional, _ = planted_problem([8.0])
    return gate.observe(second_moment, directional, torch.ones(heads), need=need)


def _need_gate(**overrides):
    return build_gate(gate_config(gate_rule="need", **overrides), 0)


def test_the_first_probe_stops_at_once_but_grows_only_at_a_plateau():
    """Without a plateau reference the first check reads the probe: no need stops the layer at once, a need
    waits ("pending") for a plateau, where the next probe decides; later moving checks read nothing."""
    needed, idle = _evidence(1.0, 5.0, 0.3, 0.0), _evidence(1.0, 1.0, 0.3, 0.0)
    gate = _need_gate()
    assert isinstance(gate, NeedGate) and gate.phase(1.0, 0.0) == "first" and gate.reads_probe(1.0, 0.0)
    decision = gate.decide(_observation(gate, needed))
    assert decision.action == "pending" and decision.direction is None and not decision.function_preserving
    assert decision.prototypes_from == 0  # a grown head starts from the first head's prototype bank
    assert gate.phase(0.5, 0.0) == "moving" and not gate.reads_probe(0.5, 0.0)  # probed once: waits quietly
    assert gate.decide(_observation(gate, _evidence(0.5, 5.0, 0.3, 0.0))).action == "pending"
    assert gate.phase(0.495, 0.0) == "ready"  # moved by 1 % of 0.5 <= 2 %
    assert gate.decide(_observation(gate, _evidence(0.495, 5.0, 0.3, 0.0))).action == "grow"
    gate = _need_gate()
    assert gate.decide(_observation(gate, idle)).action == "stop"
    gate = _need_gate()
    assert gate.decide(_observation(gate, _evidence(1.0, 5.0, 0.01, 0.0))).action == "stop"  # gain < 0.02


def test_a_plateau_reference_lets_the_first_check_grow_and_a_moving_one_wait():
    """`record_loss` (the callback's loss when growth starts) is the first check's plateau reference."""
    gate = _need_gate()
    gate.record_loss(1.0)
    assert int(gate.num_checks) == 0 and gate.phase(1.01, 0.0) == "ready"
    assert gate.decide(_observation(gate, _evidence(1.01, 5.0, 0.3, 0.0))).action == "grow"
    gate = _need_gate()
    gate.record_loss(1.0)
    assert gate.phase(0.9, 0.0) == "first"  # moved by 10 %: the probe may stop, not grow
    assert gate.decide(_observation(gate, _evidence(0.9, 5.0, 0.3, 0.0))).action == "pending"
    gate = _need_gate()
    gate.record_loss(1.0)
    assert gate.decide(_observation(gate, _evidence(0.9, 1.0, 0.3, 0.0))).action == "stop"


def _grown_once(**overrides):
    """A need gate that grew head 1 at a plateau of loss 2.0."""
    gate = _need_gate(**overrides)
    gate.record_loss(2.0)
    assert gate.decide(_observation(gate, _evidence(2.0, 5.0, 0.3, 0.0))).action == "grow"
    gate.record_growth(1, None)
    return gate


def test_a_moving_loss_waits_and_a_settled_one_decides():
    gate = _grown_once()
    used = 1.0  # removing the newest head raises the loss by 1 > 0.1 x loss
    assert [gate.phase(loss, used) for loss in (1.9, 1.97, 2.1)] == ["moving", "ready", "moving"]
    assert not gate.reads_probe(1.9, used) and gate.reads_probe(1.97, used)
    assert gate.decide(_observation(gate, _evidence(1.9, 5.0, 0.3, used), 2)).action == "pending"
    assert gate.decide(_observation(gate, _evidence(2.1, 5.0, 0.3, used), 2)).action == "pending"  # rose
    assert gate.decide(_observation(gate, _evidence(2.1, 1.0, 0.3, used), 2)).action == "stop"  # settled


def test_a_loss_near_zero_settles_on_the_absolute_floor():
    gate = _need_gate()
    gate.decide(_observation(gate, _evidence(0.002, 5.0, 0.3, 0.0)))  # first probe, no reference: waits
    assert gate.reads_probe(0.0011, 0.0) and not gate.reads_probe(0.0035, 0.0)  # |change| <= 1e-3 nats
    assert gate.decide(_observation(gate, _evidence(0.0011, 0.5, 0.0, 0.0), 2)).action == "stop"


def test_growth_waits_for_the_newest_head_to_be_used_or_for_the_patience():
    """While the newest head is unused the verdict is "pending" without reading the probe (a lack of need
    stops nothing then); once it is used, or after `gate_need_patience` settled checks, the probe decides."""
    gate = _grown_once(gate_need_patience=3)
    unused = _evidence(2.0, 0.0, 0.0, 0.1)  # removing the head raises the loss by 0.1 = 0.05 x loss
    assert gate.phase(unused.loss, unused.rise) == "waiting" and not gate.reads_probe(
        unused.loss, unused.rise
    )
    assert [gate.decide(_observation(gate, unused, 2)).action for _ in range(2)] == ["pending", "pending"]
    assert gate.phase(2.0, 0.1) == "ready"
    assert gate.decide(_observation(gate, _evidence(2.0, 5.0, 0.3, 0.1), 2)).action == "grow"
    gate.record_growth(2, None)
    assert int(gate.need_newest_head) == 2 and int(gate.need_waiting) == 0
    used = _evidence(2.0, 5.0, 0.3, 0.21)  # > 0.1 x loss
    assert gate.decide(_observation(gate, used, 3)).action == "grow"
    gate.record_growth(3, None)
    assert gate.decide(_observation(gate, _evidence(2.0, 1.0, 0.3, 0.5), 4)).action == "stop"


def test_a_model_that_fits_its_monitor_rows_reads_the_probe_while_its_newest_head_waits():
    """A waiting or moving check of a model whose own error on the monitor rows is at most
    `gate_need_error` is "fitted": no need stops the layer; a need leaves it pending, a waiting check still
    counts towards the patience, and the patience then lets the probe grow."""
    unused = 0.1  # removing the newest head raises the loss by 0.05 x loss: unused
    gate = _grown_once(gate_need_patience=3)
    assert gate.phase(2.0, unused, fit_error=0.006) == "waiting"  # 0.006 > 0.005: not fitted
    assert not gate.reads_probe(2.0, unused, 0.006)
    assert gate.phase(2.0, unused, fit_error=0.005) == "fitted" and gate.reads_probe(2.0, unused, 0.005)
    no_need = _evidence(2.0, 1.0, 0.3, unused, fit_error=0.0)
    assert gate.decide(_observation(gate, no_need, 2)).action == "stop"
    gate = _grown_once(gate_need_patience=3)
    needed = _evidence(2.0, 5.0, 0.3, unused, fit_error=0.0)
    assert [gate.decide(_observation(gate, needed, 2)).action for _ in range(2)] == ["pending", "pending"]
    assert int(gate.need_waiting) == 2 and gate.phase(2.0, unused, 0.0) == "ready"
    assert gate.decide(_observation(gate, needed, 2)).action == "grow"
    gate = _grown_once()
    assert gate.phase(1.5, unused, 0.0) == "fitted"  # the loss moves, but nothing is left to buy
    assert gate.decide(_observation(gate, _evidence(1.5, 5.0, 0.3, unused, fit_error=0.0), 2)).action == (
        "pending"
    )
    assert int(gate.need_waiting) == 0  # a moving check does not count towards the patience
    assert gate.decide(_observation(gate, _evidence(1.2, 1.0, 0.3, unused, fit_error=0.0), 2)).action == (
        "stop"
    )


def test_need_evidence_reads_the_probe_of_a_fitted_model_whose_newest_head_waits():
    """The same batch once with the loss and a fit error that leave the newest head waiting (no probe
    drawn), once fitted (the probe is drawn and read)."""
    model, batch = _needs2_batch(32)
    model.grow_head(0, function_preserving=False)
    gate = model.base_model.layers[0].attention.gate
    loss = task_scores(model, **batch).loss
    gate.record_loss(loss)
    gate.need_probed.fill_(1)
    drawn = []

    def probe_rows():
        drawn.append(len(drawn))
        return batch

    (waiting,) = need_evidence(model, **batch, loss=loss, fit_error=0.5, probe_rows=probe_rows)
    assert drawn == [] and (waiting.t, waiting.error) == (0.0, 0.0) and waiting.fit_error == 0.5
    assert gate.phase(loss, waiting.rise) == "waiting"  # the head is unused at initialisation
    (fitted,) = need_evidence(model, **batch, loss=loss, fit_error=0.0, probe_rows=probe_rows)
    assert drawn == [0] and fitted.rise == waiting.rise and fitted.fit_error == 0.0
    assert fitted.t != 0.0 and fitted.error > 0.0  # the probe was read


def test_the_need_rule_reports_full_at_the_cap_and_follows_pruning():
    gate = _grown_once(max_heads=2)
    assert gate.decide(_observation(gate, _evidence(2.0, 5.0, 0.3, 1.0), 2)).action == "full"
    gate.record_pruning(0)
    assert int(gate.need_newest_head) == 0
    gate.record_pruning(0)
    assert int(gate.need_newest_head) == -1


def test_the_need_rule_refuses_a_check_without_evidence():
    model = tiny_model(gate_rule="need")
    ids = torch.randint(5, 48, (4, 24))
    with pytest.raises(ValueError, match="need test"):
        model.gate_check(input_ids=ids)
    with pytest.raises(ValueError, match="one per layer"):
        model.gate_check(input_ids=ids, need=[])
    with pytest.raises(ValueError, match="one per layer"):
        model.gate_check(input_ids=ids, need=[_evidence(1.0, math.nan, 0.0, 0.0)])
    assert int(model.base_model.layers[0].attention.gate.num_checks) == 0  # refused checks leave no trace


def _need_model(task, **shape):
    """A tiny `gate_rule="need"` classifier of a synthetic task's vocabulary, length and classes."""
    spec = task_spec(task)
    return tiny_model(
        vocab_size=spec["vocab_size"],
        max_position_embeddings=spec["seq_len"],
        num_labels=spec.get("num_classes", 2),
        gate_rule="need",
        **shape,
    )


def _needs2_batch(rows: int = 64):
    task = build_majority_relations_task(2, num_train=rows, num_validation=8, seed=0)
    model = _need_model(task, pooling="cls", prototype_loss_weight=0.0)
    batch = {name: torch.tensor(task["train"][name]) for name in ("input_ids", "attention_mask", "labels")}
    return model, batch


def test_need_evidence_measures_the_task_loss_and_the_newest_heads_removal():
    model, batch = _needs2_batch()
    model.grow_head(0, function_preserving=False)  # the gate records it as the newest head
    assert need_evidence(model, **batch)[0].rise == 0.0  # no plateau reference: no removal is measured
    gate = model.base_model.layers[0].attention.gate
    gate.record_loss(task_scores(model, **batch).loss)  # a plateau: the removal is measured
    evidence = need_evidence(model, **batch)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = F.cross_entropy(logits.double(), batch["labels"])
        model.base_model.layers[0].attention.heads[1].o_proj.weight.zero_()
        removed = F.cross_entropy(
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.double(),
            batch["labels"],
        )
    (layer,) = evidence
    assert layer.loss == pytest.approx(float(loss), rel=1e-9)
    assert layer.rise == pytest.approx(float(removed - loss), abs=1e-9)
    assert math.isfinite(layer.t) and math.isfinite(layer.gain)


def test_need_evidence_probes_its_own_rows_and_draws_them_only_when_a_verdict_reads_them():
    """The callback's split: loss and removal on the monitor rows, the probe on a gate batch drawn only for
    a verdict that reads it; t and gain are the held-out test on that batch's readout and token mean."""
    model, batch = _needs2_batch(128)
    monitor = {name: value[:32] for name, value in batch.items()}
    drawn = []

    def probe_rows():
        drawn.append(len(drawn))
        return batch

    (layer,) = need_evidence(model, **monitor, probe_rows=probe_rows)  # a first check reads the probe
    assert drawn == [0]
    model.eval()
    with torch.no_grad():
        inputs = {name: batch[name] for name in ("input_ids", "attention_mask")}
        outputs = model.base_model(**inputs, output_hidden_states=True)
        mask = batch["attention_mask"][..., None].double()
        mean = (outputs.hidden_states[0].double() * mask).sum(1) / mask.sum(1)
        readout = outputs.pooler_output.double()
        monitor_logits = model(
            input_ids=monitor["input_ids"], attention_mask=monitor["attention_mask"]
        ).logits
    without, errors = held_out_scores(readout, batch["labels"], 4)
    with_mean, errors_with = held_out_scores(torch.cat([readout, mean], 1), batch["labels"], 4)
    t, gain = paired_drop(without, with_mean)
    assert (layer.t, layer.gain) == (pytest.approx(t, rel=1e-6), pytest.approx(gain, rel=1e-6))
    error, error_with = float(errors.mean()), float(errors_with.mean())
    assert (layer.error, layer.error_with) == (
        pytest.approx(error, abs=1e-12),
        pytest.approx(error_with, abs=1e-12),
    )
    assert layer.error_drop == pytest.approx(error - error_with, abs=1e-12)
    assert layer.error_t == pytest.approx(paired_drop(errors, errors_with)[0], rel=1e-9)
    assert layer.loss == pytest.approx(float(F.cross_entropy(monitor_logits.double(), monitor["labels"])))
    fit_error = float((monitor_logits.argmax(1) != monitor["labels"]).double().mean())
    assert layer.fit_error == fit_error > 0.005  # the model's own error on the monitor rows
    assert layer.rise == 0.0  # no grown head to remove
    gate = model.base_model.layers[0].attention.gate
    gate.need_probed.fill_(1)
    gate.record_loss(10 * layer.loss)  # the loss moves: nothing but the loss and error are measured
    expected = [NeedEvidence.unprobed(layer.loss, 0.0, fit_error)]
    assert need_evidence(model, **monitor, probe_rows=probe_rows) == expected
    assert drawn == [0]


def test_task_scores_are_the_loss_and_error_by_hand_and_the_gates_second_moments_from_the_same_forward():
    model, batch = _needs2_batch(16)
    inputs = {name: batch[name] for name in ("input_ids", "attention_mask")}
    loss, error, moments = task_scores(model, **batch, num_tokens=100)
    model.eval()
    with torch.no_grad():
        logits = model(**inputs).logits.double()
    assert loss == pytest.approx(float(F.cross_entropy(logits, batch["labels"])), rel=1e-12)
    wrong = sum(int(row.argmax()) != int(label) for row, label in zip(logits, batch["labels"], strict=True))
    assert error == wrong / 16
    assert task_scores(model, **batch) == (pytest.approx(loss, rel=1e-12), error, None)
    for got, expected in zip(moments, model.gate_second_moments(**inputs, num_tokens=100), strict=True):
        torch.testing.assert_close(got, expected)


def test_need_evidence_refuses_what_it_cannot_test():
    model, batch = _needs2_batch()
    with pytest.raises(TypeError, match="DDCLIncrtForSequenceClassification"):
        need_evidence(DDCLIncrtModel(model.config), **batch)
    with pytest.raises(ValueError, match="at least 4"):
        need_evidence(model, **{name: value[:3] for name, value in batch.items()})
    with pytest.raises(ValueError, match="class indices"):
        need_evidence(model, **{**batch, "labels": batch["labels"] + 100})
    with pytest.raises(ValueError, match="`labels`"):
        need_evidence(model, **{**batch, "labels": batch["labels"].float()})
    with pytest.raises(ValueError, match="single-label"):
        need_evidence(tiny_model(num_labels=1, gate_rule="need"), **batch)


def test_grow_head_keeps_the_initialisation_when_not_function_preserving():
    model, batch = _needs2_batch()
    inputs = {name: batch[name] for name in ("input_ids", "attention_mask")}
    model.eval()
    with torch.no_grad():
        before = model(**inputs).logits
        preserving = model.grow_head(0)
        torch.testing.assert_close(model(**inputs).logits, before)
        grown = model.grow_head(0, function_preserving=False)
        changed = model(**inputs).logits
    assert not preserving.o_proj.weight.any()
    assert float(grown.o_proj.weight.detach().std()) == pytest.approx(model.config.initializer_range, rel=0.3)
    assert not torch.allclose(changed, before)
    with pytest.raises(TypeError, match="function_preserving"):
        model.grow_head(0, function_preserving=1)


def test_grow_head_starts_from_a_heads_prototype_bank_and_refuses_a_head_it_does_not_have():
    model, _ = _needs2_batch()
    attention = model.base_model.layers[0].attention
    with torch.no_grad():
        attention.heads[0].prototype_bank.prototypes.mul_(3.0)  # a bank unlike a fresh draw
        attention.heads[0].prototype_bank.rho.fill_(-1.0)
    donor = attention.heads[0].prototype_bank
    fresh = model.grow_head(0, function_preserving=False)
    grown = model.grow_head(0, function_preserving=False, prototypes_from=0)
    assert torch.equal(grown.prototype_bank.prototypes, donor.prototypes)
    assert torch.equal(grown.prototype_bank.temperature(), donor.temperature())
    assert grown.prototype_bank.prototypes.data_ptr() != donor.prototypes.data_ptr()  # a copy, not a tie
    assert not torch.equal(fresh.prototype_bank.prototypes, donor.prototypes)
    assert float(fresh.prototype_bank.temperature().detach()) == pytest.approx(model.config.tau_init)
    assert float(grown.o_proj.weight.detach().std()) == pytest.approx(model.config.initializer_range, rel=0.3)
    for bad in (True, -1, 3, "0", 1.0):
        with pytest.raises(ValueError, match="prototypes_from"):
            model.grow_head(0, prototypes_from=bad)
    assert len(attention.heads) == 3  # refused growths add nothing
    assert (
        build_gate(gate_config(), 0).decide(_observation(build_gate(gate_config(), 0), None)).prototypes_from
        is None
    )


def test_the_callback_grows_need_heads_from_the_first_heads_prototype_bank(tmp_path):
    """At a zero learning rate nothing trains: the loss stays at its plateau, the probe finds the relations
    in the token mean, the rule grows, and the grown head's bank is still the copy of head 0's."""
    task = build_majority_relations_task(2, num_train=256, num_validation=8, seed=0)
    model = _need_model(task, pooling="cls", head_dim=1, prototype_loss_weight=0.0)
    callback = IncrtGrowthCallback(check_every=10, gate_batch_size=256, save_plot=False)
    args = training_args(tmp_path, max_steps=20, learning_rate=0.0)
    Trainer(model=model, args=args, train_dataset=task["train"], callbacks=[callback]).train()
    assert [event["action"] for event in callback.history["events"]] == ["grow"]
    first, grown = model.base_model.layers[0].attention.heads
    assert torch.equal(grown.prototype_bank.prototypes, first.prototype_bank.prototypes)
    assert torch.equal(grown.prototype_bank.rho, first.prototype_bank.rho)


@pytest.mark.parametrize(
    "field, value",
    [
        ("gate_need_t", -1.0),
        ("gate_need_gain", 1.5),
        ("gate_need_patience", 0),
        ("gate_need_error", -0.01),
        ("gate_need_error", 1.5),
    ],
)
def test_the_need_rule_fields_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        gate_config(gate_rule="need", **{field: value})


def test_gate_need_error_takes_numbers_and_an_old_config_takes_its_default():
    with pytest.raises(TypeError, match="gate_need_error"):
        gate_config(gate_rule="need", gate_need_error="0.005")
    stored = gate_config(gate_rule="need", gate_need_error=0.01).to_dict()
    assert stored["gate_need_error"] == 0.01
    del stored["gate_need_error"]  # a checkpoint saved before the field existed
    assert type(gate_config()).from_dict(stored).gate_need_error == 0.005


def test_the_callback_runs_the_need_rule_and_each_verdict_follows_from_its_evidence(tmp_path):
    """A stock Trainer with the callback: the history keeps every check's evidence, and a fresh gate fed the
    same evidence (and the same growth) reaches the same verdicts."""
    task = build_majority_relations_task(2, num_train=256, num_validation=8, seed=0)
    model = _need_model(task, pooling="cls", head_dim=1, prototype_loss_weight=0.0)
    callback = IncrtGrowthCallback(check_every=10, gate_batch_size=64, save_plot=False)
    args = training_args(tmp_path, max_steps=60, learning_rate=3e-3)
    Trainer(model=model, args=args, train_dataset=task["train"], callbacks=[callback]).train()
    checks = callback.history["checks"]
    assert len(checks) >= 1 and all("need" in check for check in checks)
    assert callback.history["gate_seconds"] > 0
    replay = _need_gate(max_heads=model.config.max_heads)
    replay.record_loss(callback.history["need_reference_loss"])  # the monitor's loss when growth started
    heads = 1
    for check in checks:
        evidence = NeedEvidence(**check["need"][0])
        action = replay.decide(_observation(replay, evidence, heads)).action
        assert action == check["action"][0]
        if action == "grow":
            replay.record_growth(heads, None)
            heads += 1
        assert check["num_heads"] == [heads]
    grown = model.base_model.layers[0].attention.heads[1:]
    assert all(head.o_proj.weight.any() for head in grown)


def test_a_saved_model_keeps_the_need_rules_state(tmp_path):
    model, batch = _needs2_batch()
    gate = model.base_model.layers[0].attention.gate
    gate.need_last_loss.fill_(0.7)
    model.grow_head(0, function_preserving=False)
    gate.need_waiting.fill_(2)
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path)
    reloaded = loaded.base_model.layers[0].attention.gate
    assert isinstance(reloaded, NeedGate) and loaded.config.num_heads == [2]
    assert float(reloaded.need_last_loss) == pytest.approx(0.7)
    assert (int(reloaded.need_newest_head), int(reloaded.need_waiting)) == (1, 2)


@pytest.mark.parametrize(
    "task_name, needs_more", [("majority relations, k = 2, at [CLS]", True), ("planted relations", False)]
)
def test_the_need_rule_grows_where_a_head_is_missing_and_stops_where_one_suffices(
    tmp_path, task_name, needs_more
):
    """Two relations read at [CLS] by heads of one dimension need a second head (docs/growth_gate.md, 'A task
    that needs k heads'); the planted task is solved by one (its static sweep is flat from one head)."""
    if needs_more:
        task = build_majority_relations_task(2, num_train=1024, num_validation=8, seed=0)
        shape = {"pooling": "cls", "head_dim": 1, "prototype_loss_weight": 0.0}
    else:
        task = build_spectral_task(num_train=1024, num_validation=8, seq_len=24, seed=0)
        shape = {"head_dim": 8}
    model = _need_model(task, **shape)
    callback = IncrtGrowthCallback(check_every=25, gate_batch_size=256, save_plot=False, start_step=100)
    args = training_args(tmp_path, max_steps=500, learning_rate=3e-3, logging_steps=100)
    Trainer(model=model, args=args, train_dataset=task["train"], callbacks=[callback]).train()
    first = callback.history["checks"][0]["need"][0]
    if needs_more:
        assert first["t"] > 3 and first["gain"] > 0.1  # the missing relation is in the token mean
        assert first["error_drop"] > 0.005 and first["error"] - first["error_with"] == first["error_drop"]
        assert model.config.num_heads[0] >= 2
    else:
        assert first["t"] < 0  # the extra features only let the probe overfit
        assert model.config.num_heads == [1] and callback.history["events"][0]["action"] == "stop"


def test_the_monitor_rows_fit_a_token_budget_and_give_the_reference_loss_when_growth_starts(
    tmp_path, monkeypatch
):
    """Of the monitor's drawn rows, the first within `NEED_MONITOR_TOKENS` tokens (here 100: four rows of
    24), the same at every check; their loss before the first step is the first check's plateau reference."""
    monkeypatch.setattr(growth, "NEED_MONITOR_TOKENS", 100)
    task = build_majority_relations_task(2, num_train=256, num_validation=8, seed=0)
    model = _need_model(task, pooling="cls", head_dim=1, prototype_loss_weight=0.0)
    drawn = np.random.default_rng([0, 0, growth.NEED_MONITOR_ROWS]).choice(256, size=64, replace=False)
    rows = task["train"].select(drawn[:4])
    expected = {name: torch.tensor(rows[name]) for name in ("input_ids", "attention_mask", "labels")}
    reference = task_scores(model, **expected).loss
    callback = IncrtGrowthCallback(check_every=10, gate_batch_size=64, save_plot=False)
    args = training_args(tmp_path, max_steps=20)
    Trainer(model=model, args=args, train_dataset=task["train"], callbacks=[callback]).train()
    assert torch.equal(callback._monitor["input_ids"], expected["input_ids"])
    assert callback.history["need_reference_loss"] == pytest.approx(reference, rel=1e-6)

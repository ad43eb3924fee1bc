"""The need rule (`gate_rule="need"`, docs/growth_gate.md, 'The need rule'): the held-out probe test against
hand computations and planted features, the rule's verdicts on hand-made evidence, the model and callback
plumbing, and bad input."""

import math

import pytest
import torch
import torch.nn.functional as F
from growth_worker import tiny_model, training_args
from test_incrt_gate import gate_config, planted_problem
from transformers import Trainer

from geoformers.models.ddcl_incrt.incrt import NeedEvidence, NeedGate, build_gate
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtModel
from geoformers.models.ddcl_incrt.need_test import held_out_losses, need_evidence, paired_drop
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
    without = held_out_losses(readout, labels, 2)
    with_feature = held_out_losses(torch.cat([readout, feature], 1), labels, 2)
    assert without.shape == (256,)
    assert without.mean() == pytest.approx(math.log(2), abs=0.1)  # the readout knows nothing
    t, gain = paired_drop(without, with_feature)
    assert t > 10 and gain > 0.5


def test_a_feature_that_carries_nothing_new_gives_no_held_out_drop():
    readout, feature = _planted_features(256, seed=1)
    labels = (readout[:, 0] + 0.3 * readout[:, 1] > 0).long()  # all in the readout already
    t, gain = paired_drop(
        held_out_losses(readout, labels, 2), held_out_losses(torch.cat([readout, feature], 1), labels, 2)
    )
    assert t < 3 and gain < 0.02


def _observation(gate, need: NeedEvidence, heads: int = 1):
    second_moment, directional, _ = planted_problem([8.0])
    return gate.observe(second_moment, directional, torch.ones(heads), need=need)


def _need_gate(**overrides):
    return build_gate(gate_config(gate_rule="need", **overrides), 0)


def test_the_first_check_grows_when_needed_and_stops_when_not():
    needed, idle = NeedEvidence(1.0, 5.0, 0.3, 0.0), NeedEvidence(1.0, 1.0, 0.3, 0.0)
    gate = _need_gate()
    assert isinstance(gate, NeedGate)
    decision = gate.decide(_observation(gate, needed))
    assert decision.action == "grow" and decision.direction is None and not decision.function_preserving
    gate = _need_gate()
    assert gate.decide(_observation(gate, idle)).action == "stop"
    gate = _need_gate()
    assert gate.decide(_observation(gate, NeedEvidence(1.0, 5.0, 0.01, 0.0))).action == "stop"  # gain < 0.02


def test_a_moving_loss_waits_and_a_settled_one_decides():
    gate = _need_gate()
    gate.decide(_observation(gate, NeedEvidence(2.0, 5.0, 0.3, 0.0)))
    gate.record_growth(1, None)
    used = 1.0  # removing the newest head raises the loss by 1 > 0.1 x loss
    assert [gate.phase(loss, used) for loss in (1.9, 1.97, 2.1)] == ["moving", "ready", "moving"]
    assert not gate.reads_probe(1.9, used) and gate.reads_probe(1.97, used)
    assert gate.decide(_observation(gate, NeedEvidence(1.9, 5.0, 0.3, used), 2)).action == "pending"
    assert gate.decide(_observation(gate, NeedEvidence(2.1, 5.0, 0.3, used), 2)).action == "pending"  # rose
    assert gate.decide(_observation(gate, NeedEvidence(2.1, 1.0, 0.3, used), 2)).action == "stop"  # settled


def test_a_loss_near_zero_settles_on_the_absolute_floor():
    gate = _need_gate()
    gate.decide(_observation(gate, NeedEvidence(0.002, 5.0, 0.3, 0.0)))  # first check: grows
    assert gate.reads_probe(0.0011, 0.0) and not gate.reads_probe(0.0035, 0.0)  # |change| <= 1e-3 nats
    assert gate.decide(_observation(gate, NeedEvidence(0.0011, 0.5, 0.0, 0.0), 2)).action == "stop"


def test_growth_waits_for_the_newest_head_to_be_used_or_for_the_patience():
    """While the newest head is unused the verdict is "pending" without reading the probe (a lack of need
    stops nothing then); once it is used, or after `gate_need_patience` settled checks, the probe decides."""
    gate = _need_gate(gate_need_patience=3)
    gate.decide(_observation(gate, NeedEvidence(2.0, 5.0, 0.3, 0.0)))
    gate.record_growth(1, None)
    unused = NeedEvidence(2.0, 0.0, 0.0, 0.1)  # removing the head raises the loss by 0.1 = 0.05 x loss
    assert gate.phase(unused.loss, unused.rise) == "waiting" and not gate.reads_probe(
        unused.loss, unused.rise
    )
    assert [gate.decide(_observation(gate, unused, 2)).action for _ in range(2)] == ["pending", "pending"]
    assert gate.phase(2.0, 0.1) == "ready"
    assert gate.decide(_observation(gate, NeedEvidence(2.0, 5.0, 0.3, 0.1), 2)).action == "grow"
    gate.record_growth(2, None)
    assert int(gate.need_newest_head) == 2 and int(gate.need_waiting) == 0
    used = NeedEvidence(2.0, 5.0, 0.3, 0.21)  # > 0.1 x loss
    assert gate.decide(_observation(gate, used, 3)).action == "grow"
    gate.record_growth(3, None)
    assert gate.decide(_observation(gate, NeedEvidence(2.0, 1.0, 0.3, 0.5), 4)).action == "stop"


def test_the_need_rule_reports_full_at_the_cap_and_follows_pruning():
    gate = _need_gate(max_heads=2)
    gate.decide(_observation(gate, NeedEvidence(2.0, 5.0, 0.3, 0.0)))
    gate.record_growth(1, None)
    assert gate.decide(_observation(gate, NeedEvidence(2.0, 5.0, 0.3, 1.0), 2)).action == "full"
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
        model.gate_check(input_ids=ids, need=[NeedEvidence(1.0, math.nan, 0.0, 0.0)])
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


@pytest.mark.parametrize(
    "field, value", [("gate_need_t", -1.0), ("gate_need_gain", 1.5), ("gate_need_patience", 0)]
)
def test_the_need_rule_fields_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        gate_config(gate_rule="need", **{field: value})


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
        assert model.config.num_heads[0] >= 2
    else:
        assert first["t"] < 0  # the extra features only let the probe overfit
        assert model.config.num_heads == [1] and callback.history["events"][0]["action"] == "stop"

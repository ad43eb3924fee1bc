"""Gate rules as objects (docs/growth_gate.md, 'Rules as objects' and 'Cadence'): one `IncrtGate` subclass per
`gate_rule`, observe then decide; the cadence is the callback's, and a checkpoint whose config.json still
holds it loads, keeps its gate state and decides as the code that saved it did."""

import json
from pathlib import Path

import pytest
import torch
from growth_worker import GATE_TOKENS, growth_callback, spectral_task, tiny_model, training_args
from safetensors.torch import load_file
from test_incrt_gate import DIM, gate_config, planted_problem
from transformers import Trainer

from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import GATE_RULES
from geoformers.models.ddcl_incrt.incrt import (
    GATE_RULE_CLASSES,
    BidirectionalGate,
    IncrtGate,
    MaxOnlyGate,
    build_gate,
)
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification
from geoformers.training.growth import IncrtGrowthCallback

# Saved by the code that kept the cadence in the config (gate_check_every=7, gate_num_tokens=24,
# gate_tracker_steps=50): a two-layer bidirectional model grown to [3, 3] heads on calibrated thresholds,
# inside the dwell of its last growth; gate_decisions.json holds that code's next check on `input_ids`.
SAVED = Path(__file__).parent / "fixtures" / "ddcl_incrt_cadence_in_config"
COMMON_STATE = {
    "u_plus",
    "u_minus",
    "basis",
    "basis_owner",
    "basis_size",
    "theta_w",
    "calibrated",
    "calibration_norms",
    "num_checks",
    "prune_counters",
}


def test_every_rule_of_the_config_has_its_gate_class_with_its_own_state():
    assert set(GATE_RULE_CLASSES) == set(GATE_RULES)
    max_only = build_gate(gate_config(gate_rule="max_only"), 0)
    bidirectional = build_gate(gate_config(gate_rule="bidirectional"), 1)
    assert type(max_only) is MaxOnlyGate and type(bidirectional) is BidirectionalGate
    assert set(max_only.state_dict()) == COMMON_STATE
    assert set(bidirectional.state_dict()) == COMMON_STATE | {"last_growth_check", "spectral_gaps"}
    base = IncrtGate(gate_config(), 0)
    second_moment, directional, _ = planted_problem([8.0])
    observation = base.observe(second_moment, directional, torch.ones(1))
    with pytest.raises(NotImplementedError, match="`_verdict`"):  # the base class holds no rule
        base.decide(observation)


def test_observe_measures_and_decide_judges():
    """observe: A_res, theta_w and the trackers (the check count and u+ move); decide: the verdict and the
    prune counters (untouched by observe)."""
    second_moment, directional, top_vectors = planted_problem([8.0, 6.0])
    gate = build_gate(gate_config(gate_prune_factor=1.0, gate_prune_patience=1), 0)
    observation = gate.observe(second_moment, directional, torch.tensor([3.0, 0.5]))
    assert int(gate.num_checks) == 1 and observation.theta_w == 2.5
    assert observation.top.eigenvalue == pytest.approx(8.0, rel=0.02)
    assert abs(float(gate.u_plus @ top_vectors[0])) == pytest.approx(1.0, abs=0.02)
    assert gate.prune_counters.tolist()[:2] == [0, 0]
    decision = gate.decide(observation)
    assert decision.action == "grow" and decision.prune == [1]  # 0.5 < phi_g = 1.0 * 2.5
    assert gate.prune_counters.tolist()[:2] == [0, 1]


def test_a_checkpoint_saved_with_the_cadence_in_its_config_loads_and_decides_alike():
    model = DDCLIncrtForSequenceClassification.from_pretrained(SAVED)
    assert model.config.num_heads == [3, 3]
    gates = [layer.attention.gate for layer in model.model.layers]
    assert all(type(gate) is BidirectionalGate for gate in gates)
    saved = load_file(SAVED / "model.safetensors")
    for index, gate in enumerate(gates):
        for name, value in gate.state_dict().items():
            torch.testing.assert_close(
                value, saved[f"model.layers.{index}.attention.gate.{name}"], rtol=0, atol=0
            )
    assert int(gates[0].last_growth_check) == 3 and float(gates[0].spectral_gaps[0]) > 0
    # the former cadence fields are plain attributes, the callback's defaults
    cadence = {"check_every": 7, "gate_num_tokens": 24, "tracker_steps": 50}
    assert IncrtGrowthCallback().cadence(model.config) == cadence
    assert IncrtGrowthCallback(check_every=2, tracker_steps=9).cadence(model.config) == {
        **cadence,
        "check_every": 2,
        "tracker_steps": 9,
    }
    expected = json.loads((SAVED / "gate_decisions.json").read_text())
    input_ids = torch.tensor(expected["input_ids"])
    decisions = model.gate_check(input_ids, num_tokens=24, tracker_steps=50)
    assert [d.action for d in decisions] == ["dwell", "grow"]
    for decision, reference in zip(decisions, expected["decisions"], strict=True):
        assert decision.action == reference["action"]
        for name in ("lambda_max", "lambda_min", "theta_w", "head_energies"):
            assert getattr(decision, name) == pytest.approx(reference[name], rel=1e-5, abs=1e-7), name
    # the dwell is counted in checks of `tracker_steps` iterations: at the default 200 layer 0 grows at once
    reloaded = DDCLIncrtForSequenceClassification.from_pretrained(SAVED)
    assert [d.action for d in reloaded.gate_check(input_ids, num_tokens=24)] == ["grow", "grow"]


def test_the_callback_takes_a_former_config_field_as_its_default(tmp_path):
    """A config carrying `gate_check_every=3` (as an old config.json does): checks at steps 3 and 6."""
    model = tiny_model(gate_check_every=3)
    callback = IncrtGrowthCallback(gate_num_tokens=GATE_TOKENS, save_plot=False)
    trainer = Trainer(
        model=model,
        args=training_args(tmp_path, max_steps=6),
        train_dataset=spectral_task()["train"],
        callbacks=[callback],
    )
    trainer.train()
    assert [check["step"] for check in growth_callback(trainer).history["checks"]] == [3, 6]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"gate_num_tokens": 1}, "`gate_num_tokens` must be None or an int >= 2"),
        ({"tracker_steps": 0}, "`tracker_steps` must be None or an int >= 1"),
        ({"tracker_steps": True}, "`tracker_steps` must be None or an int >= 1"),
        ({"check_every": 2.5}, "`check_every` must be None or an int >= 1"),
    ],
)
def test_cadence_arguments_are_validated(arguments, message):
    with pytest.raises(ValueError, match=message):
        IncrtGrowthCallback(**arguments)


def test_a_bad_former_cadence_field_is_named_with_the_argument_that_replaces_it():
    config = gate_config(gate_tracker_steps=0)
    with pytest.raises(ValueError, match="former field `gate_tracker_steps` .* pass `tracker_steps`"):
        IncrtGrowthCallback().cadence(config)
    assert IncrtGrowthCallback(tracker_steps=5).cadence(config)["tracker_steps"] == 5
    assert build_gate(config, 0).basis.shape == (config.max_heads, DIM)  # the config itself is usable

"""Optimizer groups for DDL-mHC (`training/optim.py`, docs/hc_diagnostics.md "Optimizer groups"):
membership against the parameter names and transformers' own decay split, the groups' hyper-parameters,
PEFT, bad arguments, and a stock `Trainer` run whose first Adam step and scheduled learning rates show the
multipliers."""

from collections import Counter

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig, TaskType, get_peft_model
from transformers import Trainer, TrainerCallback, TrainingArguments

import geoformers
from geoformers.training.optim import make_optimizer, parameter_groups

pytestmark = pytest.mark.usefixtures("single_thread")

LAYERS, VOCAB = 2, 29
GROUPS = ["decay", "no_decay", "prototypes", "hc_chart", "hc_gates", "hc_mix"]


def tiny_model(**overrides) -> geoformers.DDLmHCForCausalLM:
    torch.manual_seed(0)
    settings = dict(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        hc_streams=4,
        hc_chart="rtbp",
        residual="delta",
    )
    settings.update(overrides)
    return geoformers.DDLmHCForCausalLM(geoformers.DDLmHCConfig(**settings))


def asymmetric(model: geoformers.DDLmHCForCausalLM) -> geoformers.DDLmHCForCausalLM:
    """Streams that differ from the start (random EC kernel, read and chart logits): with n equal streams
    H_res X = X for every doubly-stochastic H_res, and the chart parameters get no gradient."""
    with torch.no_grad():
        model.model.stream_expansion.weight.normal_()
        for name, parameter in model.named_parameters():
            if name.endswith(("res_bias", "pre_bias")):
                parameter.normal_()
    return model


def names_by_group(model, groups) -> dict[str, set[str]]:
    name_of = {id(p): name for name, p in model.named_parameters()}
    return {group["group_name"]: {name_of[id(p)] for p in group["params"]} for group in groups}


def connection_names(leaf: str) -> set[str]:
    return {f"model.layers.{i}.{s}_connection.{leaf}" for i in range(LAYERS) for s in ("attn", "mlp")}


def test_groups_hold_every_trainable_parameter_once_with_the_documented_members(tmp_path):
    model = tiny_model()
    groups = parameter_groups(model, 1e-3, 0.1)
    assert [group["group_name"] for group in groups] == GROUPS
    counts = Counter(id(p) for group in groups for p in group["params"])
    assert set(counts.values()) == {1}
    assert set(counts) == {id(p) for p in model.parameters()}

    members = names_by_group(model, groups)
    assert members["hc_chart"] == connection_names("res_bias")
    gates = ("pre_gate", "res_gate", "write_gate")
    assert members["hc_gates"] == set().union(*(connection_names(gate) for gate in gates))
    mixes = ("res_mix_logit", "write_bias", "pre_bias")
    expected_mix = set().union(*(connection_names(leaf) for leaf in mixes))
    assert members["hc_mix"] == expected_mix | {"model.stream_readout.logits"}
    # Everything else: transformers' own decay split (an actual Trainer's get_decay_parameter_names).
    trainer = Trainer(model=model, args=TrainingArguments(str(tmp_path), report_to=[], use_cpu=True))
    trainer_decay = set(trainer.get_decay_parameter_names(model))
    rest = {name for name, _ in model.named_parameters()} - set().union(*(members[g] for g in GROUPS[2:]))
    assert members["decay"] == rest & trainer_decay
    assert members["no_decay"] == rest - trainer_decay
    maps_proj = "model.layers.0.attn_connection.maps_proj.weight"
    assert {"model.embed_tokens.weight", "lm_head.weight", maps_proj} <= members["decay"]
    assert {"model.norm.weight", "model.layers.1.mlp_connection.delta.value_proj.bias"} <= members["no_decay"]


def test_group_learning_rates_and_weight_decay():
    model = tiny_model(residual="add", hc_dynamic=False)  # H_post instead of beta; no gates, no maps_proj
    groups = {
        g["group_name"]: g
        for g in parameter_groups(model, 3e-3, 0.05, gate_lr_multiplier=2.0, mix_lr_multiplier=0.5)
    }
    expected = {
        "decay": (3e-3, 0.05),
        "no_decay": (3e-3, 0.0),
        "prototypes": (3e-2, 0.0),
        "hc_chart": (3e-3 / 6, 0.0),
        "hc_gates": (6e-3, 0.0),
        "hc_mix": (1.5e-3, 0.0),
    }
    assert groups.keys() == expected.keys()
    for name, (lr, weight_decay) in expected.items():
        assert (groups[name]["lr"], groups[name]["weight_decay"]) == pytest.approx((lr, weight_decay)), name
    assert groups["hc_gates"]["params"] == []  # static maps have no gates: the group stays, empty
    assert groups["prototypes"]["params"] == []  # DDCL-INCRT's group, kept empty
    assert len(groups["hc_mix"]["params"]) == 3 * 2 * LAYERS + 1
    custom = parameter_groups(model, 1.0, 0.0, chart_lr_multiplier=0.25)
    assert custom[GROUPS.index("hc_chart")]["lr"] == 0.25


def test_peft_model_groups_only_the_adapters():
    model = tiny_model()
    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "maps_proj"], task_type=TaskType.CAUSAL_LM)
    model = get_peft_model(model, lora)
    groups = {g["group_name"]: g for g in parameter_groups(model, 1e-3, 0.1)}
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert {id(p) for g in groups.values() for p in g["params"]} == trainable
    assert len(groups["decay"]["params"]) == 2 * 3 * LAYERS  # lora_A, lora_B of q_proj + two maps_proj
    assert all(not groups[name]["params"] for name in GROUPS[1:])


@pytest.mark.parametrize(
    ("kwargs", "name", "error"),
    [
        ({"learning_rate": -1.0}, "learning_rate", ValueError),
        ({"weight_decay": float("nan")}, "weight_decay", ValueError),
        ({"chart_lr_multiplier": 0.0}, "chart_lr_multiplier", ValueError),
        ({"gate_lr_multiplier": "2"}, "gate_lr_multiplier", TypeError),
        ({"mix_lr_multiplier": True}, "mix_lr_multiplier", TypeError),
        ({"chart_lr_multiplier": float("inf")}, "chart_lr_multiplier", ValueError),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name, error):
    arguments = {"learning_rate": 1e-3, "weight_decay": 0.0, **kwargs}
    with pytest.raises(error, match=f"`{name}`"):
        parameter_groups(tiny_model(), **arguments)


def test_bad_model_or_args_types(tmp_path):
    with pytest.raises(TypeError, match="`model`"):
        parameter_groups("model", 1e-3, 0.0)
    with pytest.raises(TypeError, match="`args`"):
        make_optimizer(tiny_model(), {"learning_rate": 1e-3})


def test_trainer_steps_with_the_groups_first_adam_step_and_scheduled_rates(tmp_path):
    """AdamW's first step moves every parameter with a non-negligible gradient by its group's learning rate
    (m / sqrt(v) = sign(g)), so the largest change of each group shows the multiplier; after the scheduler
    stepped, every group's lr is its base lr times the same schedule factor."""
    model = asymmetric(tiny_model(stream_expansion="conv"))
    ids = torch.randint(0, VOCAB, (16, 12), generator=torch.Generator().manual_seed(0))
    train = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    learning_rate, steps = 1e-2, 4
    args = TrainingArguments(
        str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=8,
        learning_rate=learning_rate,
        lr_scheduler_type="linear",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = Trainer(
        model=model, args=args, train_dataset=train, optimizers=(make_optimizer(model, args), None)
    )
    trainer.train()
    names = names_by_group(model, trainer.optimizer.param_groups)
    parameters = dict(model.named_parameters())
    expected_step = {
        "decay": learning_rate,
        "no_decay": learning_rate,
        "hc_chart": learning_rate / 6,
        "hc_gates": learning_rate,
        "hc_mix": learning_rate,
    }
    for group, step in expected_step.items():
        largest = max(float((parameters[n].detach() - before[n]).abs().max()) for n in names[group])
        assert largest == pytest.approx(step, rel=2e-2), group

    model = tiny_model()
    args = TrainingArguments(
        str(tmp_path),
        max_steps=steps,
        per_device_train_batch_size=8,
        learning_rate=learning_rate,
        lr_scheduler_type="linear",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    recorder = LearningRateRecorder()
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train,
        callbacks=[recorder],
        optimizers=(make_optimizer(model, args, gate_lr_multiplier=3.0), None),
    )
    trainer.train()
    assert sorted(recorder.rates) == list(range(1, steps + 1))
    for step, rates in recorder.rates.items():
        factor = 1 - step / steps  # linear decay, no warm-up: after `step` scheduler steps
        assert rates["decay"] == pytest.approx(learning_rate * factor, abs=1e-15)
        assert rates["no_decay"] == rates["hc_mix"] == rates["decay"]
        assert rates["hc_chart"] == pytest.approx(rates["decay"] / 6, abs=1e-15)
        assert rates["hc_gates"] == pytest.approx(rates["decay"] * 3, abs=1e-15)
    assert recorder.rates[2]["hc_chart"] == pytest.approx(learning_rate / 12)  # a mid-schedule value, nonzero


class LearningRateRecorder(TrainerCallback):
    """Each group's learning rate after every optimizer (and scheduler) step."""

    def __init__(self):
        self.rates = {}

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        self.rates[state.global_step] = {g["group_name"]: g["lr"] for g in optimizer.param_groups}

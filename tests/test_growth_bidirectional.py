"""Growth with the library's gate defaults and with the bidirectional rule inside the stock Trainer: the
defaults stop by themselves on the planted task; the bidirectional rule's dwell state survives a checkpoint
and a resumed run continues like the uninterrupted one."""

import shutil

import pytest
import torch
from growth_worker import growth_callback, growth_trainer, parameter_checksum, spectral_task, training_args
from safetensors.torch import load_file
from transformers import TrainerCallback

from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification
from geoformers.training.resume import resume_growth_training
from geoformers.training.synthetic_tasks import task_spec


@pytest.fixture(scope="module")
def task():
    return spectral_task()


def default_gate_model(task, seed: int = 0, **overrides) -> DDCLIncrtForSequenceClassification:
    """A DDCL-INCRT classifier for the planted task with no gate field set (the library's defaults)."""
    spec = task_spec(task)
    settings = {
        "vocab_size": spec["vocab_size"],
        "hidden_size": 32,
        "head_dim": 4,
        "num_prototypes": 8,
        "max_position_embeddings": spec["seq_len"],
        "num_labels": 2,
        "type_vocab_size": 0,
        "pooling": "mean",
        "hidden_dropout_prob": 0.0,
        "classifier_dropout": 0.0,
    }
    settings.update(overrides)
    torch.manual_seed(seed)
    return DDCLIncrtForSequenceClassification(DDCLIncrtConfig(**settings))


def test_default_gate_stops_growing_below_the_cap_on_the_planted_task(task, tmp_path):
    """No gate argument (relative theta_w, max_only rule), gate every 20 steps from the start: every layer's
    growth ends with a "stop" verdict, with fewer heads than max_heads = 32 // 4 = 8."""
    model = default_gate_model(task)
    args = training_args(tmp_path, max_steps=120, logging_steps=120)
    trainer = growth_trainer(model, args, task["train"], check_every=20, gate_num_tokens=None)
    trainer.train()
    history = growth_callback(trainer).history
    endings = [e for e in history["events"] if e["action"] in ("stop", "full")]
    assert [e["action"] for e in endings] == ["stop"], history["events"]
    assert 1 < model.config.num_heads[0] < model.config.max_heads == 8
    assert history["growth_stopped_at_step"] == endings[0]["step"] <= 120
    assert endings[0]["lambda_max"] <= endings[0]["theta_w"]


class RecordGateAt(TrainerCallback):
    """The gate buffers of layer 0 right after optimizer step `step` (after the growth callback's check)."""

    def __init__(self, step: int):
        self.step, self.buffers = step, None

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            gate = model.model.layers[0].attention.gate
            self.buffers = {name: buffer.clone() for name, buffer in gate.state_dict().items()}


def test_bidirectional_dwell_state_survives_a_checkpoint_and_the_resumed_run_matches(task, tmp_path):
    """gate_rule="bidirectional" with a long dwell: checkpoint-8 holds the dwell state (last growth check,
    spectral gaps), and resuming from it gives the uninterrupted run's checks, heads, gate state, weights."""
    settings = {"gate_rule": "bidirectional", "gate_dwell_kappa": 50.0}
    model = default_gate_model(task, **settings)
    args = training_args(
        tmp_path / "full", max_steps=16, save_steps=8, save_strategy="steps", logging_steps=16
    )
    trainer = growth_trainer(model, args, task["train"], check_every=2, gate_num_tokens=None)
    recorder = RecordGateAt(8)
    trainer.add_callback(recorder)
    trainer.train()
    history = growth_callback(trainer).history
    actions = [check["action"][0] for check in history["checks"]]
    assert "grow" in actions and "dwell" in actions, actions  # the dwell held back a growth
    saved = load_file(tmp_path / "full" / "checkpoint-8" / "model.safetensors")
    prefix = "model.layers.0.attention.gate."
    for name in ("last_growth_check", "spectral_gaps"):
        assert torch.equal(saved[prefix + name], recorder.buffers[name]), name
    assert int(saved[prefix + "last_growth_check"]) >= 1 and float(saved[prefix + "spectral_gaps"][0]) > 0

    output_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "full" / "checkpoint-8", output_dir / "checkpoint-8")
    resumed = growth_trainer(
        default_gate_model(task, seed=7, **settings),
        training_args(output_dir, max_steps=16, logging_steps=16),
        task["train"],
        check_every=2,
        gate_num_tokens=None,
    )
    resume_growth_training(resumed)
    resumed_history = growth_callback(resumed).history
    assert [c["action"] for c in resumed_history["checks"]] == [c["action"] for c in history["checks"]]
    assert resumed_history["num_heads"] == history["num_heads"] == resumed.model.config.num_heads
    final = {n: b for n, b in trainer.model.model.layers[0].attention.gate.state_dict().items()}
    for name, buffer in resumed.model.model.layers[0].attention.gate.state_dict().items():
        assert torch.equal(buffer, final[name]), name
    assert parameter_checksum(resumed.model) == parameter_checksum(trainer.model)

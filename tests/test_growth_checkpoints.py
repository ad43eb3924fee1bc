"""Checkpoints of a growing DDCL-INCRT run: exactly the active heads, identical reload, interrupted saves
that never load wrongly, and resume in a fresh process that continues like the uninterrupted run."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from growth_worker import (
    growth_callback,
    growth_trainer,
    parameter_checksum,
    spectral_task,
    step_losses,
    tiny_model,
    training_args,
)
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSequenceClassification

from geoformers.training.growth import (
    HISTORY_FILE,
    MARKER_FILE,
    checkpoint_problem,
    latest_complete_checkpoint,
    resume_growth_training,
)

WORKER = Path(__file__).resolve().parent / "growth_worker.py"
HEAD_KEY = re.compile(r"^model\.layers\.(\d+)\.attention\.heads\.(\d+)\.")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def task():
    return spectral_task()


@pytest.fixture(scope="module")
def run(task, tmp_path_factory):
    """The uninterrupted run: 40 steps, gate every 5 steps (heads grow at 5, 10, 15; max_heads 4 is reached
    at 20), a checkpoint every 10 steps."""
    output_dir = tmp_path_factory.mktemp("checkpointed_run")
    args = training_args(output_dir, max_steps=40, save_strategy="steps", save_steps=10)
    trainer = growth_trainer(tiny_model(), args, task["train"], check_every=5)
    trainer.train()
    return trainer, output_dir


def head_counts_in_weights(checkpoint: Path) -> list[int]:
    keys = load_file(checkpoint / "model.safetensors")
    heads = {match.groups() for key in keys if (match := HEAD_KEY.match(key))}
    return [len({head for layer, head in heads if layer == "0"})]


def test_every_checkpoint_holds_exactly_the_active_heads_and_reloads_identically(run, task):
    trainer, output_dir = run
    heads_at = {check["step"]: check["num_heads"] for check in growth_callback(trainer).history["checks"]}
    assert heads_at[10] == [3] and heads_at[40] == [4]
    for step in (10, 20, 30, 40):
        checkpoint = output_dir / f"checkpoint-{step}"
        assert checkpoint_problem(checkpoint) is None
        marker = json.loads((checkpoint / MARKER_FILE).read_text())
        config = json.loads((checkpoint / "config.json").read_text())
        assert marker["num_heads"] == config["num_heads"] == heads_at[step]
        assert head_counts_in_weights(checkpoint) == heads_at[step]
        assert json.loads((checkpoint / HISTORY_FILE).read_text())["checks"][-1]["step"] == step
    reloaded = AutoModelForSequenceClassification.from_pretrained(output_dir / "checkpoint-40")
    assert reloaded.config.num_heads == [4]
    batch = torch.tensor(task["validation"]["input_ids"][:16])
    trainer.model.eval()
    with torch.no_grad():
        assert torch.equal(reloaded(batch).logits, trainer.model(batch).logits)
    assert latest_complete_checkpoint(output_dir) == str(output_dir / "checkpoint-40")


def interrupted_copy(run, tmp_path, interruption: str) -> tuple[Path, Path]:
    """output_dir with a complete checkpoint-10 and a checkpoint-20 whose save went wrong as named."""
    _, source = run
    output_dir = tmp_path / "out"
    complete = output_dir / "checkpoint-10"
    broken = output_dir / "checkpoint-20"
    shutil.copytree(source / "checkpoint-10", complete)
    shutil.copytree(source / "checkpoint-20", broken)
    if interruption == "before the completion marker":
        (broken / MARKER_FILE).unlink()
    elif interruption == "before optimizer.pt":
        (broken / "optimizer.pt").unlink()
        (broken / MARKER_FILE).unlink()
    elif interruption == "after config.json, over an older save":  # step-10 weights, step-20 config
        shutil.copy(complete / "model.safetensors", broken / "model.safetensors")
        (broken / MARKER_FILE).unlink()
    elif interruption == "after config.json, stale marker kept":
        shutil.copy(complete / "model.safetensors", broken / "model.safetensors")
    elif interruption == "inside model.safetensors":
        data = (broken / "model.safetensors").read_bytes()
        (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    return output_dir, broken


@pytest.mark.parametrize(
    "interruption",
    ["before the completion marker", "before optimizer.pt", "after config.json, over an older save",
     "after config.json, stale marker kept", "inside model.safetensors"],
)
def test_an_interrupted_save_never_loads_wrongly_and_is_skipped(run, task, tmp_path, interruption):
    output_dir, broken = interrupted_copy(run, tmp_path, interruption)
    assert checkpoint_problem(broken) is not None
    assert latest_complete_checkpoint(output_dir) == str(output_dir / "checkpoint-10")
    trainer = growth_trainer(tiny_model(), training_args(tmp_path / "resumed"), task["train"])
    with pytest.raises(ValueError, match="incomplete"):
        resume_growth_training(trainer, broken)
    assert trainer.model.config.num_heads == [1]  # refused before anything changed
    weights_intact = interruption in ("before the completion marker", "before optimizer.pt")
    if weights_intact:  # config and weights agree: the model itself loads, at its grown size
        assert AutoModelForSequenceClassification.from_pretrained(broken).config.num_heads == [4]
    else:
        with pytest.raises(Exception, match="num_heads|header|deserializ|incomplete|invalid"):
            AutoModelForSequenceClassification.from_pretrained(broken)


def test_from_pretrained_refuses_weights_whose_heads_disagree_with_the_config(run, tmp_path):
    _, source = run
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(source / "checkpoint-20", checkpoint)  # four heads in config and weights
    weights = load_file(checkpoint / "model.safetensors")
    save_file({k: v for k, v in weights.items() if ".heads.3." not in k}, checkpoint / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing from the weights \['model.layers.0.attention.heads.3'\]"):
        AutoModelForSequenceClassification.from_pretrained(checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "num_heads": [2]}))
    with pytest.raises(ValueError, match=r"the config lacks \['model.layers.0.attention.heads.2'\]"):
        AutoModelForSequenceClassification.from_pretrained(checkpoint)


def test_plain_resume_with_a_model_of_another_size_is_refused(run, task, tmp_path):
    """`trainer.train(resume_from_checkpoint=...)` on an initial-size model fails loudly before any step: on
    loading optimizer.pt (group sizes differ) or, without it, in the callback that names the remedy."""
    _, source = run
    trainer = growth_trainer(tiny_model(), training_args(tmp_path / "a"), task["train"])
    with pytest.raises(ValueError, match="optimizer's group"):
        trainer.train(resume_from_checkpoint=str(source / "checkpoint-10"))
    checkpoint = tmp_path / "checkpoint-10"
    shutil.copytree(source / "checkpoint-10", checkpoint)
    (checkpoint / "optimizer.pt").unlink()
    trainer = growth_trainer(tiny_model(), training_args(tmp_path / "b"), task["train"])
    with pytest.raises(ValueError, match=r"model has heads \[1\] but the checkpoint .* \[3\].*resume_growth"):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert trainer.state.global_step == 10  # restored, and not one step taken
    with pytest.raises(ValueError, match="no complete checkpoint"):
        resume_growth_training(trainer)


def test_resume_in_a_fresh_process_continues_like_the_uninterrupted_run(run, tmp_path):
    """checkpoint-10 holds 3 heads while growth is still on; a new Python process resumes it with
    `resume_growth_training` on an initial-size model and must take the same growth decisions at the same
    steps, with losses equal to the uninterrupted run's (same data order, RNG and optimizer state)."""
    trainer, source = run
    result = tmp_path / "result.json"
    command = [sys.executable, str(WORKER), "resume", "--checkpoint", str(source / "checkpoint-10"),
               "--output-dir", str(tmp_path / "resumed"), "--result", str(result), "--max-steps", "40"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert completed.returncode == 0, completed.stderr[-3000:]
    resumed = json.loads(result.read_text())
    history = growth_callback(trainer).history
    assert resumed["num_heads"] == trainer.model.config.num_heads == [4]
    assert resumed["events"] == json.loads(json.dumps(history["events"]))  # the history continued
    uninterrupted = step_losses(trainer.state.log_history)
    logged = {int(step): loss for step, loss in resumed["losses"].items()}
    assert sorted(logged) == list(range(1, 41))  # steps 1-10 come from the checkpoint's trainer_state.json
    after = {step: loss for step, loss in logged.items() if step > 10}
    assert [after[step] for step in range(11, 41)] == pytest.approx(
        [uninterrupted[step] for step in range(11, 41)], rel=1e-4, abs=1e-5
    )
    assert resumed["checksum"] == parameter_checksum(trainer.model)

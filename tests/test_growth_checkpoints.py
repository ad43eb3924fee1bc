"""Checkpoints of a growing DDCL-INCRT run: exactly the active heads, identical reload, interrupted saves
that never load wrongly, and resume in a fresh process that continues like the uninterrupted run."""

import filecmp
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import torch
from growth_worker import (
    GATE_TOKENS,
    growth_callback,
    growth_trainer,
    parameter_checksum,
    spectral_task,
    step_losses,
    tiny_model,
    training_args,
)
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSequenceClassification, Trainer, TrainerCallback
from transformers.utils import logging as transformers_logging

from geoformers.training.checkpoints import (
    MARKER_FILE,
    checkpoint_problem,
    latest_complete_checkpoint,
    write_marker,
)
from geoformers.training.growth import HISTORY_FILE, IncrtGrowthCallback
from geoformers.training.optim import make_optimizer
from geoformers.training.resume import resume_growth_training

WORKER = Path(__file__).resolve().parent / "growth_worker.py"
HEAD_KEY = re.compile(r"^model\.layers\.(\d+)\.attention\.heads\.(\d+)\.")


pytestmark = pytest.mark.usefixtures("single_thread")


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
    [
        "before the completion marker",
        "before optimizer.pt",
        "after config.json, over an older save",
        "after config.json, stale marker kept",
        "inside model.safetensors",
    ],
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
    elif interruption == "inside model.safetensors":
        with pytest.raises(Exception, match="header|deserializ|incomplete|invalid"):
            AutoModelForSequenceClassification.from_pretrained(broken)
    else:  # older weights under the newer config: as in transformers, the heads they lack are new ones,
        # reported missing (the completeness check above is what refuses the checkpoint)
        _, info = AutoModelForSequenceClassification.from_pretrained(broken, output_loading_info=True)
        assert info["missing_keys"] and all(".attention.heads." in key for key in info["missing_keys"])


def test_from_pretrained_refuses_weights_of_heads_the_config_lacks(run, tmp_path):
    """A head the file lacks is initialised and reported missing, as in transformers; weights of heads the
    config does not build are refused (they would change the function)."""
    _, source = run
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(source / "checkpoint-20", checkpoint)  # four heads in config and weights
    weights = load_file(checkpoint / "model.safetensors")
    save_file(
        {k: v for k, v in weights.items() if ".heads.3." not in k},
        checkpoint / "model.safetensors",
        metadata={"format": "pt"},
    )
    _, info = AutoModelForSequenceClassification.from_pretrained(checkpoint, output_loading_info=True)
    assert info["missing_keys"] and all(".heads.3." in key for key in info["missing_keys"])
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "num_heads": [2]}))
    with pytest.raises(ValueError, match=r"no place for: \[model\.layers\.0\.attention\.heads\.2\."):
        AutoModelForSequenceClassification.from_pretrained(checkpoint)


def resumed_losses_match(resumed_losses: dict, trainer) -> None:
    """Steps 1-10 come from the checkpoint's trainer_state.json; steps 11-40 were trained again and must equal
    the uninterrupted run's losses."""
    uninterrupted = step_losses(trainer.state.log_history)
    logged = {int(step): loss for step, loss in resumed_losses.items()}
    assert sorted(logged) == list(range(1, 41))
    assert [logged[step] for step in range(11, 41)] == pytest.approx(
        [uninterrupted[step] for step in range(11, 41)], rel=1e-4, abs=1e-5
    )


def test_stock_resume_in_a_fresh_process_continues_like_the_uninterrupted_run(run, tmp_path):
    """checkpoint-10 holds 3 heads while growth is still on; a new Python process builds the documented
    set-up at the initial size (1 head, other weights, an optimizer built for 1 head) and calls the stock
    `trainer.train(resume_from_checkpoint=True)`: it must take the same growth decisions at the same steps,
    with the uninterrupted run's losses (same data order, RNG and optimizer state)."""
    trainer, source = run
    output_dir = tmp_path / "resumed"
    shutil.copytree(source / "checkpoint-10", output_dir / "checkpoint-10")
    result = tmp_path / "result.json"
    command = [
        sys.executable,
        str(WORKER),
        "stock-resume",
        "--output-dir",
        str(output_dir),
        "--result",
        str(result),
        "--max-steps",
        "40",
    ]
    completed = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    resumed = json.loads(result.read_text())
    history = growth_callback(trainer).history
    assert resumed["num_heads"] == trainer.model.config.num_heads == [4]
    assert resumed["events"] == json.loads(json.dumps(history["events"]))  # the history continued
    resumed_losses_match(resumed["losses"], trainer)
    assert resumed["checksum"] == parameter_checksum(trainer.model)


def test_resume_growth_training_continues_like_the_uninterrupted_run(run, task, tmp_path):
    """The helper picks the newest complete checkpoint (checkpoint-10 of a folder whose checkpoint-20 lost its
    marker) and continues from it like the uninterrupted run, in this process."""
    trainer, source = run
    output_dir = tmp_path / "out"
    shutil.copytree(source / "checkpoint-10", output_dir / "checkpoint-10")
    shutil.copytree(source / "checkpoint-20", output_dir / "checkpoint-20")
    (output_dir / "checkpoint-20" / MARKER_FILE).unlink()
    resumed = growth_trainer(tiny_model(seed=123), training_args(output_dir, max_steps=40), task["train"])
    resume_growth_training(resumed)
    assert resumed.model.config.num_heads == [4]
    resumed_losses_match(step_losses(resumed.state.log_history), trainer)
    assert parameter_checksum(resumed.model) == parameter_checksum(trainer.model)
    with pytest.raises(ValueError, match="no complete checkpoint"):
        resume_growth_training(growth_trainer(tiny_model(), training_args(tmp_path / "empty"), task["train"]))


def test_stock_resume_without_optimizer_state_still_takes_the_checkpoints_heads(run, task, tmp_path):
    """A checkpoint saved without optimizer.pt: the stock resume loads the grown weights into an initial-size
    model (the model follows the weights' head counts) and continues from step 10 with those heads."""
    _, source = run
    checkpoint = tmp_path / "checkpoint-10"
    shutil.copytree(source / "checkpoint-10", checkpoint)
    (checkpoint / "optimizer.pt").unlink()
    trainer = growth_trainer(tiny_model(), training_args(tmp_path / "b", max_steps=11), task["train"])
    trainer.train(resume_from_checkpoint=str(checkpoint))
    assert trainer.state.global_step == 11
    assert growth_callback(trainer).history["checks"][-1]["step"] == 10  # restored history, no check at 11
    expected = load_file(checkpoint / "model.safetensors")
    assert head_counts_in_weights(checkpoint) == [3] and trainer.model.config.num_heads == [3]
    assert set(trainer.model.state_dict()) == set(expected)


# ------------------------------------------------------------------------------------ integrity of the marker


def checkpoint_copy(run, tmp_path, steps=(30, 40)) -> Path:
    _, source = run
    output_dir = tmp_path / "out"
    for step in steps:
        shutil.copytree(source / f"checkpoint-{step}", output_dir / f"checkpoint-{step}")
    return output_dir


@pytest.fixture
def transformers_log(caplog):
    """transformers' logger does not propagate to the root logger by default; let caplog see it."""
    transformers_logging.enable_propagation()
    yield caplog
    transformers_logging.disable_propagation()


def test_bytes_changed_in_place_or_same_size_weights_of_another_checkpoint_are_detected(run, tmp_path):
    output_dir = checkpoint_copy(run, tmp_path)
    newest, older = output_dir / "checkpoint-40", output_dir / "checkpoint-30"
    assert (newest / "model.safetensors").stat().st_size == (older / "model.safetensors").stat().st_size
    shutil.copy(older / "model.safetensors", newest / "model.safetensors")  # same heads, same size
    assert "model.safetensors has changed" in checkpoint_problem(newest)
    assert latest_complete_checkpoint(output_dir) == str(older)
    data = bytearray((older / "optimizer.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte flipped in place
    (older / "optimizer.pt").write_bytes(bytes(data))
    assert "optimizer.pt has changed" in checkpoint_problem(older)
    assert latest_complete_checkpoint(output_dir) is None


def test_a_copy_keeps_the_checkpoint_complete_only_with_its_modification_times(run, tmp_path):
    _, source = run
    kept_times = tmp_path / "copy2" / "checkpoint-40"
    shutil.copytree(source / "checkpoint-40", kept_times)  # copy2: contents and times
    assert checkpoint_problem(kept_times) is None
    new_times = tmp_path / "copy" / "checkpoint-40"
    shutil.copytree(source / "checkpoint-40", new_times, copy_function=shutil.copy)  # contents only
    assert "copied without its time" in checkpoint_problem(new_times)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda c: (c / MARKER_FILE).write_text("{}"), "malformed geoformers_checkpoint.json"),
        (lambda c: (c / MARKER_FILE).write_text("[1, 2]"), "a JSON object was expected"),
        (lambda c: (c / MARKER_FILE).write_text("{trunc"), "geoformers_checkpoint.json is unreadable"),
        (
            lambda c: (c / "config.json").write_bytes(b'{"num_heads": [4], "x": "\xff\xfe"}'),
            "config.json is unreadable (UnicodeDecodeError",
        ),
        (lambda c: add_file_record(c, "config.json", {"size": "big"}), "must hold an int"),
        (lambda c: add_file_record(c, "../config.json", {"size": 1, "mtime_ns": 0}), "points outside"),
        (lambda c: edit_json(c / MARKER_FILE, global_step=30), "is for step 30"),
        (lambda c: remark(c, drop="num_heads"), "config.json has no `num_heads`"),
        (
            lambda c: keep_records(c, "config.json", "trainer_state.json", "model.safetensors"),
            "is in the checkpoint but not in geoformers_checkpoint.json",
        ),
        (lambda c: keep_records(c, "config.json", "model.safetensors"), "does not record trainer_state.json"),
        (lambda c: keep_records(c, "config.json", "trainer_state.json"), "records no model weights"),
    ],
    ids=[
        "empty marker",
        "marker a list",
        "truncated marker",
        "non-UTF-8 config",
        "bad file record",
        "path outside",
        "marker of another step",
        "config without num_heads",
        "marker rewritten without a file",
        "marker without the trainer state",
        "marker without the weights",
    ],
)
def test_a_malformed_marker_or_config_is_skipped_with_a_logged_reason(
    run, tmp_path, transformers_log, damage, reason
):
    output_dir = checkpoint_copy(run, tmp_path)
    damage(output_dir / "checkpoint-40")
    assert reason in checkpoint_problem(output_dir / "checkpoint-40")
    with transformers_log.at_level("WARNING"):
        assert latest_complete_checkpoint(output_dir) == str(output_dir / "checkpoint-30")
    assert any(
        "skipping incomplete checkpoint" in r.message and reason in r.message
        for r in transformers_log.records
    )


def edit_json(path: Path, **fields) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def add_file_record(checkpoint: Path, name: str, record) -> None:
    marker = json.loads((checkpoint / MARKER_FILE).read_text())
    edit_json(checkpoint / MARKER_FILE, files={**marker["files"], name: record})


def keep_records(checkpoint: Path, *names: str) -> None:
    """A marker rewritten by hand to list only `names` (with their true records)."""
    marker = json.loads((checkpoint / MARKER_FILE).read_text())
    edit_json(checkpoint / MARKER_FILE, files={name: marker["files"][name] for name in names})


def remark(checkpoint: Path, drop: str) -> None:
    """config.json without `drop`, and a marker written for that config (so only the config is wrong)."""
    config = json.loads((checkpoint / "config.json").read_text())
    del config[drop]
    (checkpoint / "config.json").write_text(json.dumps(config))
    write_marker(checkpoint, 40, json.loads((checkpoint / MARKER_FILE).read_text())["num_heads"])


class CrashAt(TrainerCallback):
    """Stands for a kill: raises in `on_save` at `step`, before the growth callback's on_save runs."""

    def __init__(self, step):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise KeyboardInterrupt(f"killed at step {self.step}")


def test_a_second_run_killed_inside_a_save_into_a_finished_runs_folder_never_yields_a_mix(
    run, task, tmp_path, monkeypatch
):
    """Run B (other learning rate) writes into run A's output_dir and dies after its model but before its
    optimizer at step 10: checkpoint-10 holds B's weights, A's optimizer, trainer state and marker."""
    _, source = run
    output_dir = tmp_path / "shared"
    shutil.copytree(source, output_dir)
    original = Trainer._save_optimizer_and_scheduler

    def die_at_step_10(trainer, folder):
        if trainer.state.global_step == 10:
            raise KeyboardInterrupt("killed")
        original(trainer, folder)

    monkeypatch.setattr(Trainer, "_save_optimizer_and_scheduler", die_at_step_10)
    second = growth_trainer(
        tiny_model(),
        training_args(output_dir, max_steps=40, save_strategy="steps", save_steps=10, learning_rate=2e-3),
        task["train"],
    )
    with pytest.raises(KeyboardInterrupt):
        second.train()
    mixed = output_dir / "checkpoint-10"
    assert not filecmp.cmp(mixed / "model.safetensors", source / "checkpoint-10" / "model.safetensors", False)
    assert filecmp.cmp(mixed / "optimizer.pt", source / "checkpoint-10" / "optimizer.pt", False)
    assert "has changed since the save completed" in checkpoint_problem(mixed)
    assert latest_complete_checkpoint(output_dir) == str(output_dir / "checkpoint-40")  # A's, untouched


@pytest.mark.parametrize("how", ["resume_growth_training", "stock"])
def test_with_save_total_limit_1_the_last_complete_checkpoint_survives_until_the_next_is_complete(
    task, tmp_path, how
):
    """The Trainer deletes checkpoint-5 when it writes checkpoint-10, before the growth callback marks it;
    a kill there (here: an exception in an earlier on_save) leaves the kept copy of checkpoint-5, which
    resumes to the same step-10 weights: with the helper, or with the stock call once the next Trainer moved
    the unmarked checkpoint-10 aside and linked the kept copy back as checkpoint-5."""
    args = training_args(
        tmp_path / "limited", max_steps=10, save_strategy="steps", save_steps=5, save_total_limit=1
    )
    model = tiny_model()
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=task["train"],
        optimizers=(make_optimizer(model, args), None),
        callbacks=[CrashAt(10), IncrtGrowthCallback(check_every=5, gate_num_tokens=GATE_TOKENS)],
    )
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    output_dir = Path(args.output_dir)
    assert not (output_dir / "checkpoint-5").exists()  # rotated away by the Trainer
    assert "geoformers_checkpoint.json is missing" in checkpoint_problem(output_dir / "checkpoint-10")
    kept = latest_complete_checkpoint(output_dir)
    assert kept == str(output_dir / ".kept-checkpoint-5")
    resumed = growth_trainer(tiny_model(seed=9), training_args(output_dir, max_steps=10), task["train"])
    assert sorted(p.name for p in output_dir.iterdir() if "checkpoint-" in p.name) == [
        ".incomplete-checkpoint-10",
        ".kept-checkpoint-5",
        "checkpoint-5",
    ]
    assert latest_complete_checkpoint(output_dir) == str(output_dir / "checkpoint-5")
    if how == "stock":
        resumed.train(resume_from_checkpoint=True)
    else:
        resume_growth_training(resumed, kept)
    assert resumed.state.global_step == 10 and resumed.model.config.num_heads == [3]
    uninterrupted = load_file(output_dir / ".incomplete-checkpoint-10" / "model.safetensors")
    assert all(torch.equal(value, uninterrupted[key]) for key, value in resumed.model.state_dict().items())


def test_with_save_total_limit_1_a_finished_run_leaves_only_its_last_checkpoint(task, tmp_path):
    args = training_args(tmp_path, max_steps=10, save_strategy="steps", save_steps=5, save_total_limit=1)
    growth_trainer(tiny_model(), args, task["train"], check_every=5).train()
    assert sorted(p.name for p in tmp_path.iterdir() if "checkpoint" in p.name) == ["checkpoint-10"]
    assert latest_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")


# ------------------------------------------------------------------------- real kills (slow, forked trainers)


def train_and_get_killed(train, ready, delay: float, timeout: float = 120.0) -> None:
    """Fork a process running `train()`; once `ready()` holds, SIGKILL it after `delay` seconds."""
    pid = os.fork()
    if pid == 0:  # the trainer: never returns to pytest
        try:
            train()
        finally:
            os._exit(0)
    deadline = time.monotonic() + timeout
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def same_tensors(first: dict, second: dict) -> bool:
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def optimizer_tensors(checkpoint: Path) -> dict:
    state = torch.load(checkpoint / "optimizer.pt", weights_only=True)["state"]
    return {f"{index}.{name}": value for index, entry in state.items() for name, value in entry.items()}


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks the trainer it kills")
def test_a_second_run_killed_at_random_points_in_a_finished_runs_folder_never_yields_a_mix(
    run, task, tmp_path
):
    """Run B (learning rate 2e-3, a checkpoint every 2 steps) trains into run A's output_dir and is killed
    at seeded random times; the checkpoint `latest_complete_checkpoint` returns must hold the weights and
    the optimizer state of one run (B's compared with an uninterrupted reference run of B)."""
    _, source = run

    def run_b(output_dir):
        args = training_args(
            output_dir,
            max_steps=40,
            save_strategy="steps",
            save_steps=2,
            learning_rate=2e-3,
            logging_steps=10,
        )
        growth_trainer(tiny_model(), args, task["train"]).train()

    reference = tmp_path / "reference"
    run_b(reference)
    generator = random.Random(0)
    for trial in range(6):
        output_dir = tmp_path / f"shared{trial}"
        shutil.copytree(source, output_dir)
        train_and_get_killed(partial(run_b, output_dir), lambda: True, generator.uniform(1.0, 6.0))
        chosen = Path(latest_complete_checkpoint(output_dir))
        weights, moments = load_file(chosen / "model.safetensors"), optimizer_tensors(chosen)
        origins = [folder / chosen.name for folder in (source, reference) if (folder / chosen.name).is_dir()]
        matches = [
            origin
            for origin in origins
            if same_tensors(weights, load_file(origin / "model.safetensors"))
            and same_tensors(moments, optimizer_tensors(origin))
        ]
        assert len(matches) == 1, (trial, chosen.name)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks the trainer it kills")
def test_with_save_total_limit_1_a_kill_at_random_points_always_leaves_a_complete_checkpoint(task, tmp_path):
    """A slow disk (0.2 s in an on_save before the growth callback's) widens the window between the
    Trainer's rotation and the marker; kills at seeded random times must always leave a complete one."""

    class SlowDisk(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            time.sleep(0.2)

    generator = random.Random(1)
    for trial in range(8):
        output_dir = tmp_path / f"run{trial}"
        args = training_args(
            output_dir,
            max_steps=60,
            save_strategy="steps",
            save_steps=2,
            save_total_limit=1,
            logging_steps=10,
        )
        model = tiny_model()
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=task["train"],
            optimizers=(make_optimizer(model, args), None),
            callbacks=[SlowDisk(), IncrtGrowthCallback(check_every=5, gate_num_tokens=GATE_TOKENS)],
        )
        marked = partial(lambda folder: any(folder.glob(f"checkpoint-*/{MARKER_FILE}")), output_dir)
        train_and_get_killed(trainer.train, marked, generator.uniform(0.0, 2.0))
        chosen = latest_complete_checkpoint(output_dir)
        assert chosen is not None, (trial, sorted(p.name for p in output_dir.iterdir()))
        state = json.loads((Path(chosen) / "trainer_state.json").read_text())
        assert Path(chosen).name.endswith(f"checkpoint-{state['global_step']}")
        assert (
            AutoModelForSequenceClassification.from_pretrained(chosen).config.num_heads
            == state["stateful_callbacks"]["IncrtGrowthCallback"]["attributes"]["history"]["num_heads"]
        )

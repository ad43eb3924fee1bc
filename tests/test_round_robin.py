"""`harness.round_robin.RoundRobin` (docs/experiments.md, 'Shared causal-LM recipe'): `Trainer` runs in
lockstep take their steps strictly in turn, each ends exactly as it does alone, a finished run leaves the
rotation, and an error in one run reaches the caller without leaving the others waiting."""

import pytest
import torch
from transformers import TrainerCallback, TrainingArguments

import geoformers

from harness.lm_trainer import NANOGPT_TRAINING_DEFAULTS, build_lm_trainer
from harness.random_windows import RandomWindows
from harness.round_robin import RoundRobin

pytestmark = pytest.mark.usefixtures("single_thread")

IDS = torch.randint(50, (5000,), generator=torch.Generator().manual_seed(0))


class Journal(TrainerCallback):
    """Appends (run, step) to a shared list at every step end; raises at `fail_at`."""

    def __init__(self, name: str, journal: list, fail_at: int | None = None):
        self.name, self.journal, self.fail_at = name, journal, fail_at

    def on_step_end(self, args, state, control, **kwargs):
        self.journal.append((self.name, state.global_step))
        if state.global_step == self.fail_at:
            raise RuntimeError(f"{self.name} failed at step {self.fail_at}")


def trainer(name: str, streams: int, steps: int, folder, journal: list, fail_at: int | None = None):
    torch.manual_seed(0)
    config = geoformers.DDLmHCConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2,
        hc_streams=streams,
        max_position_embeddings=16,
    )
    args = TrainingArguments(
        output_dir=str(folder),
        max_steps=steps,
        per_device_train_batch_size=4,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        **dict(NANOGPT_TRAINING_DEFAULTS, warmup_steps=2),
    )
    windows = RandomWindows(IDS, 4, 16, 1)
    callbacks = [Journal(name, journal, fail_at)]
    return build_lm_trainer(geoformers.DDLmHCForCausalLM(config), args, windows, callbacks=callbacks)


def losses(run) -> list[float]:
    return [entry["loss"] for entry in run.state.log_history if "loss" in entry]


def test_runs_alternate_and_end_as_they_do_alone(tmp_path):
    plan = {"a": (1, 5), "b": (4, 3), "c": (2, 4)}
    journal: list = []
    alone = {name: trainer(name, n, steps, tmp_path, journal) for name, (n, steps) in plan.items()}
    for run in alone.values():
        run.train()
    journal.clear()
    together = {name: trainer(name, n, steps, tmp_path, journal) for name, (n, steps) in plan.items()}
    seconds = RoundRobin(together).train()
    assert journal == [
        *(("a", 1), ("b", 1), ("c", 1), ("a", 2), ("b", 2), ("c", 2), ("a", 3), ("b", 3), ("c", 3)),
        *(("a", 4), ("c", 4), ("a", 5)),
    ]
    assert {name: len(times) for name, times in seconds.items()} == {"a": 5, "b": 3, "c": 4}
    assert all(time > 0 for times in seconds.values() for time in times)
    for name in plan:
        assert losses(together[name]) == losses(alone[name]), name


def test_an_error_in_one_run_reaches_the_caller_and_the_others_finish(tmp_path):
    journal: list = []
    runs = {
        "a": trainer("a", 1, 4, tmp_path, journal),
        "b": trainer("b", 4, 4, tmp_path, journal, fail_at=2),
    }
    with pytest.raises(RuntimeError, match="b failed at step 2"):
        RoundRobin(runs).train()
    assert journal == [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3), ("a", 4)]


def test_a_run_added_at_the_end_of_a_step_joins_after_the_next_one(tmp_path):
    """`add` from a callback at the end of a's step 2: a takes step 3, then b joins the rotation."""
    journal: list = []
    joiner = trainer("b", 4, 3, tmp_path, journal)
    rotation = None

    class Add(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                rotation.add("b", joiner)

    first = trainer("a", 1, 5, tmp_path, journal)
    first.add_callback(Add())
    rotation = RoundRobin({"a": first})
    seconds = rotation.train()
    assert journal == [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("a", 4), ("b", 2), ("a", 5), ("b", 3)]
    assert {name: len(times) for name, times in seconds.items()} == {"a": 5, "b": 3}
    with pytest.raises(ValueError, match="already in the rotation"):
        rotation.add("a", first)

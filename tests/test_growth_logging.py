"""Growth events through transformers' logging: shown at info verbosity (set_verbosity_info or the Trainer's
`log_level="info"`), one line per event of the callback's history, and silent at the default verbosity."""

import logging

import pytest
import torch
from growth_worker import growth_callback, growth_trainer, spectral_task, tiny_model, training_args
from transformers.utils import logging as hf_logging


class Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def collected():
    """Records reaching transformers' library logger; the verbosity is restored afterwards."""
    handler, verbosity = Collect(), hf_logging.get_verbosity()
    hf_logging.add_handler(handler)
    yield handler.messages
    hf_logging.remove_handler(handler)
    hf_logging.set_verbosity(verbosity)


def short_growth_run(output_dir, **args):
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = growth_trainer(
            tiny_model(),
            training_args(output_dir, max_steps=15, **args),
            spectral_task(num_train=256)["train"],
            check_every=5,
        )
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    return growth_callback(trainer).history


def growth_lines(messages: list[str]) -> list[str]:
    return [m for m in messages if m.startswith("INCRT ") and not m.startswith("INCRT growth stopped")]


def expected_lines(history: dict) -> list[str]:
    """The line each non-calibration event of the history should produce, written out independently."""
    lines = []
    for e in history["events"]:
        if e["action"] == "calibrated":
            continue
        measure = "energy" if e["action"] == "prune" else "lambda_max"
        lines.append(
            f"INCRT {e['action']} at step {e['step']}: layer {e['layer']}, "
            f"{measure} {e[measure]:.4g}, theta_w {e['theta_w']:.4g} -> heads {e['num_heads']}"
        )
    return lines


@pytest.mark.parametrize("how", ["set_verbosity_info", "trainer_log_level"])
def test_info_verbosity_shows_one_line_per_growth_event(tmp_path, collected, how):
    if how == "set_verbosity_info":
        hf_logging.set_verbosity_info()
        history = short_growth_run(tmp_path)
    else:
        hf_logging.set_verbosity_warning()
        history = short_growth_run(tmp_path, log_level="info")
    assert [e["action"] for e in history["events"]].count("grow") >= 1
    assert growth_lines(collected) == expected_lines(history)


def test_default_verbosity_shows_no_growth_event(tmp_path, collected):
    hf_logging.set_verbosity_warning()
    history = short_growth_run(tmp_path)
    assert [e["action"] for e in history["events"]].count("grow") >= 1  # events happened, quietly
    assert growth_lines(collected) == []

"""Callback metrics reach the `report_to` integrations (training/reporting.py): short stock-Trainer runs of
both models with report_to=["tensorboard"], the event file read back with TensorBoard's EventAccumulator and
compared with `state.log_history`, the growth callback's history and diagnostics recomputed on the model."""

import logging
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from growth_worker import growth_callback, growth_trainer, spectral_task, tiny_model, training_args
from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments
from transformers.integrations import TensorBoardCallback
from transformers.utils import logging as hf_logging

import geoformers
from geoformers.tokenization import build_char_tokenizer
from geoformers.training import HyperConnectionDiagnosticsCallback, hc_diagnostics, report_callback_metrics

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator", reason="needs tensorboard (the dev extra)"
)

pytestmark = pytest.mark.usefixtures("single_thread")

GROWTH_KEYS = ("incrt/num_heads_layer0", "incrt/lambda_max_layer0", "incrt/theta_w_layer0")


@pytest.fixture(autouse=True)
def default_tensorboard_folder(monkeypatch):
    """TensorBoardCallback writes under output_dir/runs/ unless TENSORBOARD_LOGGING_DIR says otherwise."""
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)


@pytest.fixture
def warnings():
    """Warnings reaching transformers' library logger (it does not propagate to the root logger)."""

    class Collect(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    handler = Collect()
    hf_logging.add_handler(handler)
    yield handler.messages
    hf_logging.remove_handler(handler)


def tensorboard_scalars(output_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] of the run's one event file."""
    (events,) = sorted(Path(output_dir).glob("runs/*/events.out.tfevents.*"))
    accumulator = event_accumulator.EventAccumulator(str(events), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def logged(log_history: list[dict], key: str) -> list[tuple[int, float]]:
    return [(record["step"], record[key]) for record in log_history if key in record]


def assert_same_series(written: list[tuple[int, float]], expected: list[tuple[int, float]]) -> None:
    """Same steps in the same order, values equal up to the event file's float32."""
    assert [step for step, _ in written] == [step for step, _ in expected]
    assert [value for _, value in written] == pytest.approx([value for _, value in expected], rel=1e-6)


# ------------------------------------------------------------------------------------------- DDCL-INCRT


def growth_run(output_dir: Path, reorder: bool) -> Trainer:
    """15 steps of the planted task, the gate every 5 steps, the loss logged every 5 steps."""
    args = training_args(output_dir, max_steps=15, logging_steps=5, report_to=["tensorboard"])
    trainer = growth_trainer(tiny_model(), args, spectral_task(num_train=256)["train"], check_every=5)
    if reorder:
        assert report_callback_metrics(trainer) is trainer
    trainer.train()
    return trainer


def test_growth_statistics_reach_tensorboard_with_the_logged_values(tmp_path, warnings):
    trainer = growth_run(tmp_path, reorder=True)
    written = tensorboard_scalars(tmp_path)
    log_history = trainer.state.log_history
    for key in GROWTH_KEYS:
        assert_same_series(written[f"train/{key}"], logged(log_history, key))
    # every check of the callback's history is in the event file at its step, heads grown along the way
    checks = growth_callback(trainer).history["checks"]
    assert [check["step"] for check in checks] == [5, 10, 15]
    heads = dict(written["train/incrt/num_heads_layer0"])
    lambda_max = dict(written["train/incrt/lambda_max_layer0"])
    assert [heads[check["step"]] for check in checks] == [check["num_heads"][0] for check in checks]
    assert [lambda_max[check["step"]] for check in checks] == pytest.approx(
        [check["lambda_max"][0] for check in checks], rel=1e-6
    )
    assert heads[15] > 1  # heads grew during the run
    assert_same_series(written["train/loss"], logged(log_history, "loss"))
    assert not any("report_callback_metrics" in message for message in warnings)


def test_without_the_reordering_integrations_miss_them_and_a_warning_says_so(tmp_path, warnings):
    """transformers calls the integrations before the callbacks passed to the Trainer: the statistics are in
    log_history but not in the event file, and the callback says what to call."""
    trainer = growth_run(tmp_path, reorder=False)
    written = tensorboard_scalars(tmp_path)
    assert logged(trainer.state.log_history, GROWTH_KEYS[0]) and "train/loss" in written
    assert not any(tag.startswith("train/incrt/") for tag in written)
    (warning,) = [message for message in warnings if "report_callback_metrics" in message]
    assert "IncrtGrowthCallback" in warning and "TensorBoardCallback" in warning


# ---------------------------------------------------------------------------------------------- DDL-mHC

TEXT = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer\n" * 8


def test_hyper_connection_diagnostics_reach_tensorboard_with_the_logged_values(tmp_path):
    """6 steps, the loss logged every 4, the diagnostics every 2: records at steps 2, 4 and 6."""
    tokenizer = build_char_tokenizer(TEXT)
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    blocks = Dataset.from_dict({"input_ids": [ids[i : i + 16] for i in range(0, len(ids) - 16, 16)]})
    torch.manual_seed(0)
    config = geoformers.DDLmHCConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=2,
        hc_streams=4,
        hc_chart="tbp",
        residual="delta",
    )
    args = TrainingArguments(
        str(tmp_path),
        max_steps=6,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        logging_steps=4,
        save_strategy="no",
        report_to=["tensorboard"],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(
        model=geoformers.DDLmHCForCausalLM(config),
        args=args,
        train_dataset=blocks,
        callbacks=[HyperConnectionDiagnosticsCallback(every=2, probe_size=4)],
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
    )
    report_callback_metrics(trainer)
    trainer.train()
    written = tensorboard_scalars(tmp_path)
    final = hc_diagnostics(trainer.model, torch.tensor(blocks["input_ids"][:4]))  # recomputed independently
    assert (
        len(final) == 2 * 2 * 6 + 2 * 2
    )  # layers x sublayers x metrics, and the two stream metrics per layer
    for key, value in final.items():
        series = written[f"train/{key}"]
        assert_same_series(series, logged(trainer.state.log_history, key))
        assert [step for step, _ in series] == [2, 4, 6]
        assert series[-1][1] == pytest.approx(value, rel=1e-6, abs=1e-7)
    assert [step for step, _ in written["train/loss"]] == [2, 4, 6]


# ---------------------------------------------------------------------------------- the reordering itself


def test_reordering_moves_only_the_integrations_behind_the_other_callbacks(tmp_path, warnings):
    args = training_args(tmp_path, max_steps=1, report_to=["tensorboard"])
    trainer = growth_trainer(tiny_model(), args, spectral_task(num_train=64)["train"])
    before = [type(callback).__name__ for callback in trainer.callback_handler.callbacks]
    assert before.index("TensorBoardCallback") < before.index("IncrtGrowthCallback")
    report_callback_metrics(report_callback_metrics(trainer))  # idempotent
    after = [type(callback).__name__ for callback in trainer.callback_handler.callbacks]
    assert after == [name for name in before if name != "TensorBoardCallback"] + ["TensorBoardCallback"]
    late = HyperConnectionDiagnosticsCallback(every=1, input_ids=torch.zeros(1, 2, dtype=torch.long))
    trainer.add_callback(late)  # added behind the integration: warned about at train start
    late.on_train_begin(args, trainer.state, trainer.control)
    assert any("HyperConnectionDiagnosticsCallback" in message for message in warnings)
    assert isinstance(trainer.callback_handler.callbacks[-2], TensorBoardCallback)
    with pytest.raises(TypeError, match="`trainer` must be a transformers.Trainer"):
        report_callback_metrics(trainer.callback_handler)

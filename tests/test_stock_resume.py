"""`trainer.train(resume_from_checkpoint=True)` as users call it, on a run whose newest checkpoint is
incomplete (its weights truncated, or the save killed before the trainer state was written): DDCL-INCRT with
`IncrtGrowthCallback` and DDL-mHC with `CompleteCheckpointsCallback` resume from the previous complete
checkpoint and continue like the uninterrupted run (training/checkpoints.py)."""

import logging
import shutil
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from growth_worker import (
    growth_trainer,
    parameter_checksum,
    spectral_task,
    step_losses,
    tiny_model,
    training_args,
)
from transformers import DataCollatorForLanguageModeling, Trainer
from transformers.trainer_utils import get_last_checkpoint

import geoformers
from geoformers.tokenization import build_char_tokenizer
from geoformers.training.checkpoints import (
    INCOMPLETE_PREFIX,
    MARKER_FILE,
    CompleteCheckpointsCallback,
    checkpoint_problem,
    hide_incomplete_checkpoints,
    latest_complete_checkpoint,
)
from geoformers.training.optim import make_optimizer

pytestmark = pytest.mark.usefixtures("single_thread")

TEXT = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer\n" * 8
TOKENIZER = build_char_tokenizer(TEXT)


def incrt_trainer(output_dir: Path, seed: int = 0, **args) -> Trainer:
    """DDCL-INCRT at its initial size (one head), the gate every 5 steps."""
    arguments = training_args(output_dir, **{"max_steps": 10, **args})
    return growth_trainer(tiny_model(seed=seed), arguments, spectral_task()["train"])


def ddl_mhc_trainer(output_dir: Path, seed: int = 0, **args) -> Trainer:
    """A small DDL-mHC on 16-character blocks, the documented optimizer groups, complete checkpoints."""
    ids = TOKENIZER(TEXT, add_special_tokens=False)["input_ids"]
    blocks = Dataset.from_dict({"input_ids": [ids[i : i + 16] for i in range(0, len(ids) - 16, 16)]})
    torch.manual_seed(seed)
    model = geoformers.DDLmHCForCausalLM(
        geoformers.DDLmHCConfig(
            vocab_size=len(TOKENIZER),
            hidden_size=16,
            intermediate_size=24,
            num_hidden_layers=2,
            num_attention_heads=2,
            hc_streams=4,
            hc_chart="rtbp",
            residual="delta",
        )
    )
    arguments = training_args(output_dir, **{"max_steps": 10, "per_device_train_batch_size": 4, **args})
    return Trainer(
        model=model,
        args=arguments,
        train_dataset=blocks,
        data_collator=DataCollatorForLanguageModeling(TOKENIZER, mlm=False),
        optimizers=(make_optimizer(model, arguments), None),
        callbacks=[CompleteCheckpointsCallback()],
    )


BUILDERS = {"ddcl_incrt": incrt_trainer, "ddl_mhc": ddl_mhc_trainer}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """model -> (trainer, output_dir) of 10 steps with checkpoints at 5 and 10."""
    runs = {}
    for name, build in BUILDERS.items():
        output_dir = tmp_path_factory.mktemp(name)
        trainer = build(output_dir, save_strategy="steps", save_steps=5)
        trainer.train()
        runs[name] = (trainer, output_dir)
    return runs


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def truncated_weights(checkpoint: Path) -> None:
    """The newest checkpoint's weights cut in half after the save (a disk that lost the end of the file)."""
    truncate(checkpoint / "model.safetensors")


def killed_inside_the_save(checkpoint: Path) -> None:
    """A kill while the Trainer wrote optimizer.pt: no trainer state, no marker."""
    truncate(checkpoint / "optimizer.pt")
    for name in ("scheduler.pt", "rng_state.pth", "trainer_state.json", MARKER_FILE):
        (checkpoint / name).unlink(missing_ok=True)


@pytest.fixture
def warnings(caplog):
    with caplog.at_level(logging.WARNING, logger="geoformers.training.checkpoints"):
        yield caplog


@pytest.mark.parametrize("damage", [truncated_weights, killed_inside_the_save])
@pytest.mark.parametrize("model", sorted(BUILDERS))
def test_stock_resume_skips_an_incomplete_newest_checkpoint(uninterrupted, tmp_path, warnings, model, damage):
    reference, source = uninterrupted[model]
    output_dir = tmp_path / "run"
    shutil.copytree(source, output_dir)  # copy2: modification times kept, so checkpoints stay complete
    broken = output_dir / "checkpoint-10"
    damage(broken)
    assert get_last_checkpoint(str(output_dir)) == str(broken)  # what the stock call would take

    trainer = BUILDERS[model](output_dir, seed=123, save_strategy="steps", save_steps=5)  # other weights
    hidden = output_dir / f"{INCOMPLETE_PREFIX}checkpoint-10"
    assert not broken.exists() and hidden.is_dir() and checkpoint_problem(hidden) is not None
    (message,) = [m for m in warnings.messages if m.startswith("moved the incomplete")]
    assert str(hidden) in message and str(output_dir / "checkpoint-5") in message

    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 10
    resumed, expected = step_losses(trainer.state.log_history), step_losses(reference.state.log_history)
    assert sorted(resumed) == list(range(1, 11))
    assert [resumed[step] for step in range(6, 11)] == pytest.approx(
        [expected[step] for step in range(6, 11)], rel=1e-5, abs=1e-6
    )  # steps 6-10 trained again from checkpoint-5, like the uninterrupted run
    assert parameter_checksum(trainer.model) == parameter_checksum(reference.model)
    assert checkpoint_problem(broken) is None  # the resumed run saved step 10 again, completely
    assert latest_complete_checkpoint(output_dir) == str(broken)


def test_a_folder_without_a_complete_checkpoint_is_left_as_it_is(uninterrupted, tmp_path):
    """Checkpoints saved without the callback have no marker: nothing is moved, the stock call behaves as in
    transformers."""
    _, source = uninterrupted["ddl_mhc"]
    output_dir = tmp_path / "run"
    shutil.copytree(source, output_dir)
    for step in (5, 10):
        (output_dir / f"checkpoint-{step}" / MARKER_FILE).unlink()
    before = sorted(path.name for path in output_dir.iterdir())
    assert hide_incomplete_checkpoints(output_dir) is None
    ddl_mhc_trainer(output_dir)
    assert sorted(path.name for path in output_dir.iterdir()) == before


def test_a_checkpoint_older_than_the_newest_complete_one_stays(uninterrupted, tmp_path):
    """Only checkpoints newer than the newest complete one are moved: an older damaged one is the user's."""
    _, source = uninterrupted["ddl_mhc"]
    output_dir = tmp_path / "run"
    shutil.copytree(source, output_dir)
    truncated_weights(output_dir / "checkpoint-5")
    assert hide_incomplete_checkpoints(output_dir) == str(output_dir / "checkpoint-10")
    assert (output_dir / "checkpoint-5").is_dir()
    assert not list(output_dir.glob(f"{INCOMPLETE_PREFIX}*"))

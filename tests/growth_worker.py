"""Small DDCL-INCRT growth runs for tests/test_growth_*.py, importable and runnable in fresh processes.

    python tests/growth_worker.py resume --checkpoint DIR --output-dir DIR --result FILE
    python tests/growth_worker.py stock-resume --output-dir DIR --result FILE
    torchrun --standalone --nproc_per_node 2 tests/growth_worker.py ddp \
        --output-dir DIR --result FILE
    torchrun --standalone --nproc_per_node 2 tests/growth_worker.py ddp-need \
        --output-dir DIR --result FILE

`resume` trains a fresh initial-size model from a checkpoint with `resume_growth_training`, `stock-resume`
with the stock `trainer.train(resume_from_checkpoint=True)` from the newest checkpoint in the output
directory; `ddp` trains with growth on every rank, `ddp-need` the same under `gate_rule="need"` on the
needs2 task at a zero learning rate (nothing trains; the need test grows a head). All write a JSON result
(per rank for the DDP modes: FILE with `.rank<r>` inserted).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

import torch
from transformers import Trainer, TrainingArguments

import geoformers  # noqa: F401  (registers the Auto classes)
from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification
from geoformers.training.growth import IncrtGrowthCallback
from geoformers.training.optim import make_optimizer
from geoformers.training.resume import resume_growth_training
from geoformers.training.synthetic_tasks import build_majority_relations_task, build_spectral_task, task_spec

SEQ_LEN = 24
GATE_TOKENS = 256  # tokens per gate check (the callback's `gate_num_tokens`)


def spectral_task(num_train: int = 512):
    """The planted task (four directional relations of strengths 0.9 > 0.8 > 0.7 > 0.6), 24 tokens a row."""
    return build_spectral_task(num_train=num_train, num_validation=64, seq_len=SEQ_LEN, seed=0)


def sign_rows(dataset):
    """Tokens 1 and 2 of each row spell its index (index // 40 + 5, index % 40 + 5): a gate batch's rows can
    be read back with `signed_row_indices`."""
    return dataset.map(
        lambda row, index: {
            "input_ids": [row["input_ids"][0], index // 40 + 5, index % 40 + 5] + row["input_ids"][3:]
        },
        with_indices=True,
    )


def signed_row_indices(input_ids: torch.Tensor) -> list[int]:
    """The row indices spelled by `sign_rows` in a batch of input_ids, in batch order."""
    return [(high - 5) * 40 + (low - 5) for high, low in input_ids[:, 1:3].tolist()]


def tiny_model(seed: int = 0, **overrides) -> DDCLIncrtForSequenceClassification:
    settings = {
        "vocab_size": 48,
        "hidden_size": 32,
        "head_dim": 8,
        "num_hidden_layers": 1,
        "num_heads": 1,
        "max_heads": 4,
        "num_prototypes": 8,
        "max_position_embeddings": SEQ_LEN,
        "num_labels": 2,
        "hidden_dropout_prob": 0.0,
        "classifier_dropout": 0.0,
        "pooling": "mean",
    }
    settings.update(overrides)
    torch.manual_seed(seed)
    return DDCLIncrtForSequenceClassification(DDCLIncrtConfig(**settings))


def training_args(output_dir, **overrides) -> TrainingArguments:
    settings = {
        "output_dir": str(output_dir),
        "max_steps": 40,
        "per_device_train_batch_size": 32,
        "learning_rate": 3e-3,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": True,
        "disable_tqdm": True,
        "seed": 0,
        "dataloader_num_workers": 0,
    }
    settings.update(overrides)
    return TrainingArguments(**settings)


def growth_trainer(
    model, args, train_dataset, check_every: int = 5, gate_num_tokens: int | None = GATE_TOKENS
) -> Trainer:
    """The documented set-up: prototype parameter groups and the growth callback (`gate_num_tokens` None:
    the callback's default)."""
    return Trainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        optimizers=(make_optimizer(model, args), None),
        callbacks=[IncrtGrowthCallback(check_every=check_every, gate_num_tokens=gate_num_tokens)],
    )


def growth_callback(trainer: Trainer) -> IncrtGrowthCallback:
    return next(c for c in trainer.callback_handler.callbacks if isinstance(c, IncrtGrowthCallback))


def parameter_checksum(model) -> str:
    """sha256 over every parameter's bytes, in named_parameters order."""
    digest = hashlib.sha256()
    for name, parameter in model.named_parameters():
        digest.update(name.encode())
        digest.update(parameter.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def step_losses(log_history: list[dict]) -> dict[int, float]:
    return {entry["step"]: entry["loss"] for entry in log_history if "loss" in entry}


def _resume(options) -> None:
    model = tiny_model(seed=123)  # initial size and other weights: the checkpoint must overwrite them
    args = training_args(options.output_dir, max_steps=options.max_steps)
    trainer = growth_trainer(model, args, spectral_task()["train"])
    if options.mode == "stock-resume":
        trainer.train(resume_from_checkpoint=True)
    else:
        resume_growth_training(trainer, options.checkpoint)
    history = json.loads((Path(options.output_dir) / "growth_history.json").read_text())
    Path(options.result).write_text(
        json.dumps(
            {
                "num_heads": model.config.num_heads,
                "losses": step_losses(trainer.state.log_history),
                "events": history["events"],
                "checksum": parameter_checksum(model),
            }
        )
    )


def _ddp(options) -> None:
    torch.set_num_threads(1)
    # Different initial weights per rank (DDP broadcasts rank 0's); a prune factor that prunes during the run.
    model = tiny_model(
        seed=int(os.environ["RANK"]), max_heads=3, gate_prune_factor=30.0, gate_prune_patience=2
    )
    args = training_args(
        options.output_dir,
        max_steps=options.max_steps,
        save_strategy="steps",
        save_steps=options.max_steps,
        logging_steps=5,
    )
    trainer = growth_trainer(model, args, spectral_task()["train"], check_every=3)
    trainer.train()
    callback = growth_callback(trainer)
    rank = torch.distributed.get_rank()
    strict_args = training_args(
        Path(options.output_dir) / "refused", max_steps=2, ddp_find_unused_parameters=False
    )
    try:  # pruning is enabled, so DDP without find_unused_parameters must be refused before any step
        growth_trainer(
            tiny_model(max_heads=3, gate_prune_factor=30.0), strict_args, spectral_task()["train"]
        ).train()
        refusal = None
    except ValueError as error:
        refusal = str(error)
    path = Path(options.result)
    path.with_name(f"{path.stem}.rank{rank}{path.suffix}").write_text(
        json.dumps(
            {
                "world_size": torch.distributed.get_world_size(),
                "pid": os.getpid(),
                "num_heads": model.config.num_heads,
                "checksum": parameter_checksum(model),
                "events": callback.history["events"],
                "checks": callback.history["checks"],
                "refusal_without_find_unused": refusal,
            }
        )
    )


def _ddp_need(options) -> None:
    """The need rule under DDP: each rank monitors and probes its own rows; the loss, the fit error and the
    evidence are averaged over the ranks, so both take the same checks."""
    torch.set_num_threads(1)
    task = build_majority_relations_task(2, num_train=512, num_validation=8, seed=0)
    spec = task_spec(task)
    model = tiny_model(
        seed=int(os.environ["RANK"]),
        vocab_size=spec["vocab_size"],
        max_position_embeddings=spec["seq_len"],
        num_labels=spec["num_classes"],
        gate_rule="need",
        pooling="cls",
        head_dim=1,
        prototype_loss_weight=0.0,
    )
    args = training_args(options.output_dir, max_steps=options.max_steps, learning_rate=0.0)
    callback = IncrtGrowthCallback(check_every=10, gate_batch_size=256, save_plot=False)
    Trainer(model=model, args=args, train_dataset=task["train"], callbacks=[callback]).train()
    rank = torch.distributed.get_rank()
    heads = model.base_model.layers[0].attention.heads
    path = Path(options.result)
    path.with_name(f"{path.stem}.rank{rank}{path.suffix}").write_text(
        json.dumps(
            {
                "num_heads": model.config.num_heads,
                "checksum": parameter_checksum(model),
                "events": callback.history["events"],
                "checks": callback.history["checks"],
                "banks_copied": all(
                    torch.equal(head.prototype_bank.prototypes, heads[0].prototype_bank.prototypes)
                    for head in heads[1:]
                ),
            }
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["resume", "stock-resume", "ddp", "ddp-need"])
    parser.add_argument("--output-dir", dest="output_dir", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--checkpoint")
    parser.add_argument("--max-steps", dest="max_steps", type=int, default=40)
    options = parser.parse_args()
    {"ddp": _ddp, "ddp-need": _ddp_need}.get(options.mode, _resume)(options)

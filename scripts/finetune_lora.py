"""Adapt a saved DDL-mHC checkpoint to a new text file with LoRA (docs/experiments.md, 'finetune_lora.py').

`--checkpoint` is a folder written by `train_causal_lm.py` (or any `save_pretrained` of a DDL-mHC model
with its tokenizer beside it, e.g. an upcycled Llama, docs/upcycling.md); a Llama folder is accepted too,
for the same adaptation of the model it was upcycled from. The new text is tokenised with that tokenizer
(characters it does not know become `<unk>`; more than `--max_unk_fraction` of them is an error) and split
like nanoGPT (first
`--train_fraction` train, the rest validation). `peft.LoraConfig(target_modules=...)` wraps the named
projections; the defaults are the attention projections and the hyper-connection / delta projections:

    q_proj k_proj v_proj o_proj      attention (self_attn.*)
    maps_proj                        fused dynamic H_pre / H_res / write logits ({attn,mlp}_connection.*)
    value_proj                       delta value v ({attn,mlp}_connection.delta.*)
    gate_proj up_proj down_proj      MLP (not in the defaults; add them with --target_modules)

Training is the causal-LM scripts' `Trainer` (`harness.lm_trainer`: `make_optimizer`, nanoGPT's warm-up +
cosine, clipping, random windows; every `TrainingArguments` field is a flag) on the adapter parameters
only. It reports the trainable parameters (count and %), the median step time and the validation loss
before and after on the same fixed windows, saves the adapter (`adapter_config.json`,
`adapter_model.safetensors`) and the tokenizer to `--output_dir`, and with `--merge` also the merged
model to `--output_dir/merged`. The numbers go to `--output_dir/lora_report.json`.

    python scripts/finetune_lora.py --checkpoint outputs/ddl_mhc_char --data new.txt --output_dir outputs/lora
    python scripts/finetune_lora.py ... --target_modules q_proj v_proj maps_proj --lora_r 4 --merge
"""

import argparse
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from peft import LoraConfig, TaskType, get_peft_model
from peft.tuners.lora import LoraLayer
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig, set_seed

import geoformers
from geoformers.tokenization import unknown_characters
from geoformers.tokenization.encoding import listed

from harness.causal_lm import estimate_loss, split_ids
from harness.flags import parsed_settings, training_arguments
from harness.lm_trainer import build_lm_trainer, lm_parser
from harness.random_windows import RandomWindows
from harness.results import write_results
from harness.step_timer import StepTimer
from harness.threads import set_threads
from harness.window_loss import WindowLoss

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "maps_proj", "value_proj")


# ----------------------------------------------------------------------------------------------
# Checkpoint and data


def load_checkpoint(checkpoint: str | Path, device: torch.device):
    """(model, tokenizer) from a local DDL-mHC (or Llama) folder; the model is loaded by absolute path, so the
    saved adapter's `base_model_name_or_path` finds it again from any working directory."""
    folder = Path(checkpoint).resolve()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"--checkpoint {checkpoint} is not a saved model folder (no config.json)")
    config = AutoConfig.from_pretrained(folder)
    if not isinstance(config, (geoformers.DDLmHCConfig, LlamaConfig)):
        raise ValueError(
            f"--checkpoint {checkpoint} holds a {config.model_type!r} model; this script adapts DDL-mHC "
            "('ddl_mhc') and Llama ('llama') checkpoints"
        )
    model = AutoModelForCausalLM.from_pretrained(folder, config=config).to(device)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError(
            f"--checkpoint tokenizer has {len(tokenizer)} tokens but the model's vocab_size is "
            f"{model.config.vocab_size}: the tokenizer does not belong to this model"
        )
    return model, tokenizer


def encode_text(path: str | Path, tokenizer, max_unk_fraction: float) -> tuple[torch.Tensor, int]:
    """(token ids, number of `<unk>` tokens) of a UTF-8 file; characters the tokenizer does not know are
    listed in the error when more than `max_unk_fraction` of the tokens are `<unk>`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--data {path} does not exist")
    text = path.read_text(encoding="utf-8")
    if not text:
        raise ValueError(f"--data {path} is empty")
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    unk_id = tokenizer.unk_token_id
    num_unknown = 0 if unk_id is None else sum(token == unk_id for token in ids)
    if num_unknown > max_unk_fraction * len(ids):
        shown = listed(unknown_characters(tokenizer, text))
        raise ValueError(
            f"{num_unknown} of {len(ids)} tokens of --data are {tokenizer.unk_token!r} "
            f"(> --max_unk_fraction={max_unk_fraction}); unknown characters: {shown}"
        )
    return torch.tensor(ids, dtype=torch.long), num_unknown


# ----------------------------------------------------------------------------------------------
# LoRA


def check_arguments(args: argparse.Namespace, config) -> None:
    """Clear errors for flags that would otherwise fail deep inside PEFT or the model."""
    if args.lora_r < 1:
        raise ValueError(f"--lora_r must be >= 1, got {args.lora_r}")
    if args.lora_alpha <= 0:
        raise ValueError(f"--lora_alpha must be > 0, got {args.lora_alpha}")
    if not 0.0 <= args.lora_dropout < 1.0:
        raise ValueError(f"--lora_dropout must lie in [0, 1), got {args.lora_dropout}")
    if not 0.0 < args.train_fraction < 1.0:
        raise ValueError(f"--train_fraction must lie in (0, 1), got {args.train_fraction}")
    if not 1 <= args.block_size <= config.max_position_embeddings:
        raise ValueError(
            f"--block_size must lie in [1, max_position_embeddings={config.max_position_embeddings}] of the "
            f"checkpoint, got {args.block_size}"
        )


def lora_config_for(model: nn.Module, args: argparse.Namespace) -> LoraConfig:
    """`LoraConfig` over `--target_modules` (leaf names of `nn.Linear` modules; by default those of
    `DEFAULT_TARGETS` the model has: a static model has no `maps_proj`, an "add" one no `value_proj`)."""
    linear_names = {
        name.rpartition(".")[-1] for name, module in model.named_modules() if isinstance(module, nn.Linear)
    }
    targets = args.target_modules
    if targets is None:
        targets = [name for name in DEFAULT_TARGETS if name in linear_names]
    unknown = sorted(set(targets) - linear_names)
    if unknown:
        raise ValueError(
            f"--target_modules {unknown} name no nn.Linear of this model; its projections are "
            f"{sorted(linear_names)}"
        )
    module_names = {name.rpartition(".")[-1] for name, _ in model.named_modules()}
    unknown = sorted(set(args.modules_to_save) - module_names)
    if unknown:
        raise ValueError(f"--modules_to_save {unknown} name no module of this model")
    return LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=list(targets),
        modules_to_save=list(args.modules_to_save) or None,
        use_rslora=args.use_rslora,
    )


@dataclass
class LoraArguments:
    """`peft.LoraConfig`'s settings."""

    _argument_group_name = "LoRA (peft.LoraConfig)"

    target_modules: list[str] | None = field(
        default=None,
        metadata={
            "help": "leaf names of the nn.Linear projections to adapt (default: those of "
            f"{list(DEFAULT_TARGETS)} the model has)"
        },
    )
    modules_to_save: list[str] = field(
        default_factory=list,
        metadata={"help": "modules trained in full and saved with the adapter (e.g. lm_head)"},
    )
    lora_r: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    use_rslora: bool = field(default=False, metadata={"help": "scale by alpha / sqrt(r), not alpha / r"})


@dataclass
class AdaptArguments:
    """The checkpoint, the new text's split and checks, and merging."""

    _argument_group_name = "adaptation"

    checkpoint: str = field(metadata={"help": "saved DDL-mHC (or Llama) model + tokenizer folder"})
    train_fraction: float = 0.9
    max_unk_fraction: float = field(
        default=0.01, metadata={"help": "most tolerated fraction of <unk> tokens in --data"}
    )
    merge: bool = field(default=False, metadata={"help": "also save the merged model: OUTPUT_DIR/merged"})


def main(argv: list[str] | None = None) -> dict:
    parser = lm_parser(
        AdaptArguments,
        LoraArguments,
        description=__doc__,
        max_steps=500,
        warmup_steps=20,
        weight_decay=0.0,
        eval_steps=100,  # the validation loss on fixed windows every N steps (0: off; harness.window_loss)
        output_dir=str(REPO_ROOT / "outputs" / "ddl_mhc_lora"),
    )
    args = parser.parse_args(argv)
    if args.data is None:
        parser.error("--data is required: the UTF-8 text file to adapt the checkpoint to")
    set_threads(args.threads)
    set_seed(args.seed)
    training_args = training_arguments(args)

    model, tokenizer = load_checkpoint(args.checkpoint, training_args.device)
    check_arguments(args, model.config)
    ids, num_unknown = encode_text(args.data, tokenizer, args.max_unk_fraction)
    train_ids, val_ids = split_ids(ids, args.train_fraction, args.block_size)
    print(f"{len(train_ids):,} train / {len(val_ids):,} val tokens ({num_unknown:,} <unk>)")

    def evaluate(network, split) -> float:
        batch = args.per_device_train_batch_size
        return estimate_loss(network, split, batch, args.block_size, args.eval_batches, 0, network.device)

    val_loss_before = evaluate(model, val_ids)
    model = get_peft_model(model, lora_config_for(model, args))
    trainable, total = model.get_nb_trainable_parameters()
    wrapped = Counter(
        name.rpartition(".")[-1] for name, module in model.named_modules() if isinstance(module, LoraLayer)
    )
    print(
        f"trainable parameters: {trainable:,} of {total:,} ({100 * trainable / total:.3f} %) in "
        f"{sum(wrapped.values())} LoRA layers {dict(sorted(wrapped.items()))}"
    )

    timer = StepTimer()
    validation = WindowLoss(
        val_ids,
        args.per_device_train_batch_size,
        args.block_size,
        args.eval_batches,
        args.eval_steps,
        on_eval=lambda step, loss: print(f"step {step}: val {loss:.4f}"),
    )
    windows = RandomWindows(train_ids, args.per_device_train_batch_size, args.block_size, args.seed)
    trainer = build_lm_trainer(
        model,
        training_args,
        windows,
        callbacks=[timer, validation],
        chart_lr_multiplier=args.chart_lr_multiplier,
    )
    trainer.train()
    val_loss_after = evaluate(model, val_ids)
    history = [*validation.history, {"step": args.max_steps, "val_loss": val_loss_after}]
    print(f"validation loss: {val_loss_before:.4f} before -> {val_loss_after:.4f} after LoRA")
    print(f"median step: {statistics.median(timer.seconds):.3f} s")

    output_dir = Path(args.output_dir)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    report = {
        "checkpoint": str(Path(args.checkpoint).resolve()),
        "data": str(Path(args.data).resolve()),
        "train_tokens": len(train_ids),
        "val_tokens": len(val_ids),
        "unknown_tokens": num_unknown,
        "trainable_parameters": trainable,
        "total_parameters": total,
        "trainable_percent": 100 * trainable / total,
        "lora_layers": dict(sorted(wrapped.items())),
        "val_loss_before": val_loss_before,
        "val_loss_after": val_loss_after,
        "median_step_seconds": statistics.median(timer.seconds),
        "history": history,
    }
    if args.merge:
        merged = model.merge_and_unload()
        merged.save_pretrained(output_dir / "merged")
        tokenizer.save_pretrained(output_dir / "merged")
        report["merged_val_loss"] = evaluate(merged, val_ids)
        print(f"merged model: validation loss {report['merged_val_loss']:.4f}, saved to {output_dir}/merged")
    record = write_results(
        output_dir / "lora_report.json", "finetune_lora.py", argv, parsed_settings(args), report
    )
    print(f"saved the adapter and tokenizer to {output_dir}")
    return record


if __name__ == "__main__":
    main()

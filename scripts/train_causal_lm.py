"""Train a DDL-mHC causal LM (docs/ddl_mhc.md) on a text file, character level, nanoGPT style.

The text is split like nanoGPT's shakespeare_char (first 90 % train, last 10 % validation) and tokenised
by `geoformers.tokenization.build_char_tokenizer`. Training: random (batch, block) windows, AdamW with
linear warm-up and cosine decay to `--min_lr_ratio` x `--learning_rate`, gradient clipping, a validation loss
every `--eval_steps` steps, a sampled continuation at the end (`harness.causal_lm`). The text is the hub's
tiny-shakespeare, or the local file `--data`. The model and tokenizer are saved with
`save_pretrained`, so `AutoModelForCausalLM.from_pretrained(out)` / `AutoTokenizer.from_pretrained(out)`
load them after `import geoformers`.

Every `DDLmHCConfig` field is a flag of its own (`--hc_streams 4 --residual delta --hc_chart rtbp ...`);
`vocab_size` and the special token ids come from the tokenizer.

    python scripts/train_causal_lm.py                                  # nanoGPT's small CPU config
    python scripts/train_causal_lm.py --max_steps 200 --hc_streams 1 --residual add --output_dir outputs/llama
"""

import argparse
import dataclasses
import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

import geoformers
from geoformers.configuration.ddl_mhc import DDLmHCConfig

from harness.causal_lm import (
    SMALL_CPU_SHAPE,
    estimate_loss,
    load_corpus,
    loop_parser,
    make_trainer,
)
from harness.results import write_results
from harness.threads import set_threads

REPO_ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_FIELDS = ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id")


# ----------------------------------------------------------------------------------------------
# Config flags


def _own_config_fields() -> list[dataclasses.Field]:
    """The fields DDLmHCConfig declares (decoder + DDL-mHC), minus those the tokenizer sets."""
    own = DDLmHCConfig.__annotations__
    return [f for f in dataclasses.fields(DDLmHCConfig) if f.name in own and f.name not in TOKENIZER_FIELDS]


def json_value(text: str):
    """A flag value: JSON when it parses (numbers, true/false, null, dicts), else the raw string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _config_flag(config_field: dataclasses.Field) -> tuple:
    """The `make_dataclass` field of one config field: parsed by `json_value`, default nanoGPT's small CPU
    shape where it has the field, else the config's."""
    default = SMALL_CPU_SHAPE.get(config_field.name, config_field.default)
    return (
        config_field.name,
        json_value,
        dataclasses.field(default=default, metadata={"help": f"default {default!r}"}),
    )


ConfigArguments = dataclasses.make_dataclass(
    "ConfigArguments",
    [_config_flag(config_field) for config_field in _own_config_fields()],
    namespace={"_argument_group_name": "DDLmHCConfig fields (JSON values: 4, 1e-3, true, null, {...})"},
)


@dataclasses.dataclass
class TrainArguments:
    """Evaluation and the sample at the end."""

    _argument_group_name = "evaluation and sample"

    eval_steps: int = dataclasses.field(default=250, metadata={"help": "validation loss every N steps"})
    sample_tokens: int = dataclasses.field(default=300, metadata={"help": "characters sampled at the end"})
    temperature: float = dataclasses.field(default=0.8, metadata={"help": "of the sample"})


def config_from_args(args: argparse.Namespace, tokenizer, block_size: int) -> DDLmHCConfig:
    """DDLmHCConfig from the field flags; invalid values raise the config's ValueError/TypeError."""
    fields = {field.name: getattr(args, field.name) for field in _own_config_fields()}
    fields["max_position_embeddings"] = max(fields["max_position_embeddings"], block_size)
    return DDLmHCConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **fields,
    )


def main() -> None:
    parser = loop_parser(
        TrainArguments,
        ConfigArguments,
        description=__doc__,
        output_dir=str(REPO_ROOT / "outputs" / "ddl_mhc_char"),
    )
    args = parser.parse_args()
    if args.eval_steps < 1:
        parser.error(f"--eval_steps must be >= 1, got {args.eval_steps}")
    set_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)

    tokenizer, train_ids, val_ids = load_corpus(args.data)
    tokenizer.model_max_length = args.block_size
    config = config_from_args(args, tokenizer, args.block_size)
    model = geoformers.DDLmHCForCausalLM(config).to(device)
    print(f"{model.num_parameters():,} parameters; {len(train_ids):,} train / {len(val_ids):,} val tokens")
    print(config.to_json_string(use_diff=True))

    def evaluate(split_ids) -> float:
        return estimate_loss(
            model, split_ids, args.per_device_train_batch_size, args.block_size, args.eval_batches, 0, device
        )

    history = []
    progress = tqdm(total=args.max_steps, desc="train", unit="step")

    def on_step(step: int, loss: float) -> None:
        progress.update(1)
        progress.set_postfix(loss=f"{loss:.4f}")
        if step % args.eval_steps == 0 or step == args.max_steps:
            record = {"step": step, "train_loss": evaluate(train_ids), "val_loss": evaluate(val_ids)}
            history.append(record)
            progress.write(f"step {step}: train {record['train_loss']:.4f}, val {record['val_loss']:.4f}")

    step = make_trainer(model, train_ids, args, device)
    seconds = []
    for index in range(1, args.max_steps + 1):
        loss, elapsed = step()
        seconds.append(elapsed)
        on_step(index, loss)
    progress.close()
    tokens_per_second = (
        args.per_device_train_batch_size * args.block_size / sorted(seconds)[len(seconds) // 2]
    )
    print(f"median training throughput: {tokens_per_second:,.0f} tokens/s")

    model.eval()
    prompt = torch.tensor([[tokenizer.bos_token_id]], device=device)
    sample = model.generate(
        prompt,
        max_new_tokens=args.sample_tokens,
        do_sample=True,
        temperature=args.temperature,
        pad_token_id=tokenizer.pad_token_id,
    )
    print("--- sample ---")
    print(tokenizer.decode(sample[0, 1:], skip_special_tokens=True))

    output_dir = Path(args.output_dir)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    print(f"saved model and tokenizer to {output_dir}")
    write_results(
        output_dir / "training_history.json",
        "train_causal_lm.py",
        None,
        vars(args),
        {"history": history, "tokens_per_second": tokens_per_second},
    )


if __name__ == "__main__":
    main()

"""Train a DDL-mHC causal LM (docs/ddl_mhc.md) with the stock `Trainer`, in the shape of transformers'
`examples/pytorch/language-modeling/run_clm.py` (docs/experiments.md, 'train_causal_lm.py').

Flags: `ModelArguments`, `DataTrainingArguments` and every `TrainingArguments` field (`HfArgumentParser`).

- Model: from the `DDLmHCConfig` field flags (`--hc_streams 4 --residual delta --hc_chart rtbp ...`;
  `vocab_size` and the special token ids come from the tokenizer); or `--model_name_or_path`: a saved
  DDL-mHC folder, or a Llama (folder, Hub id, `.gguf` file) converted by `geoformers.convert_llama_to_ddl_mhc`
  with the config flags given on the command line as its overrides (docs/upcycling.md).
- Data: `--dataset_name/--dataset_config_name` (default the Hub's `karpathy/tiny_shakespeare`; `--streaming`
  for large corpora) or `--train_file` (`--validation_file`) local text files; a corpus without a validation
  split gives its first `--validation_split_percentage` % (run_clm's split). Tokenised with
  `--tokenizer_name`, the model folder's tokenizer, or a character tokenizer built over the text
  (`build_char_tokenizer`), then packed into `--block_size` blocks (run_clm's `group_texts`).
- Training: `Trainer` with `geoformers.training.make_optimizer` (`harness.lm_trainer`); the defaults are
  nanoGPT's small CPU recipe. `--save_steps`, `--resume_from_checkpoint` (a folder, or `true`: the newest in
  `--output_dir`), `--report_to`, `--fsdp`/`--fsdp_config`, `--gradient_checkpointing`, `--bf16`,
  `--torch_compile`, `--eval_strategy` all reach the Trainer. It runs alike under `python`, `torchrun` and
  `accelerate launch` (docs/multi_process.md).

    python scripts/train_causal_lm.py --threads 1                     # nanoGPT's small CPU config
    python scripts/train_causal_lm.py --train_file input.txt --max_steps 200 --hc_streams 1 --residual add
    torchrun --nproc_per_node 2 scripts/train_causal_lm.py --use_cpu --train_file input.txt
"""

import dataclasses
import json
import sys
from itertools import chain
from pathlib import Path

import datasets
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    TrainingArguments,
    set_seed,
)
from transformers.utils import logging

import geoformers
from geoformers.models.ddl_mhc.configuration_ddl_mhc import DDLmHCConfig
from geoformers.tokenization import build_char_tokenizer, unknown_characters
from geoformers.tokenization.encoding import listed
from geoformers.training.data import TINY_SHAKESPEARE_HUB_NAME, load_hub_dataset

from harness.causal_lm import SMALL_CPU_SHAPE  # nanoGPT's small CPU config
from harness.data_errors import exit_without_data
from harness.flag_checks import CheckedParser, check_flag
from harness.flags import TRAINING_FIELD_DEFAULTS
from harness.lm_trainer import NANOGPT_TRAINING_DEFAULTS, build_lm_trainer
from harness.pretrained import load_tokenizer as load_pretrained_tokenizer
from harness.results import write_results
from harness.threads import DEFAULT_THREADS, THREADS_HELP, set_threads

logger = logging.get_logger("transformers.train_causal_lm")  # shown at transformers' default (warning) level
REPO_ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_FIELDS = ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id")
NOT_FLAGS = (*TOKENIZER_FIELDS, "use_cache")  # use_cache: generation only, and a TrainingArguments flag too
TRAINING_DEFAULTS = {
    **NANOGPT_TRAINING_DEFAULTS,
    "output_dir": str(REPO_ROOT / "outputs" / "ddl_mhc_char"),
    "max_steps": 2000,
    "per_device_train_batch_size": 12,
    "per_device_eval_batch_size": 12,
    "logging_steps": 50,
    "eval_strategy": "steps",
    "eval_steps": 250,
    "save_steps": 500,
    "report_to": "none",
}


# ----------------------------------------------------------------------------------------------
# Flags


def _own_config_fields() -> list[dataclasses.Field]:
    """The fields DDLmHCConfig declares (decoder + DDL-mHC), minus `NOT_FLAGS`."""
    own = DDLmHCConfig.__annotations__
    return [f for f in dataclasses.fields(DDLmHCConfig) if f.name in own and f.name not in NOT_FLAGS]


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
        dataclasses.field(default=default, metadata={"help": f"default {default!r}".replace("%", "%%")}),
    )


ConfigArguments = dataclasses.make_dataclass(
    "ConfigArguments",
    [_config_flag(config_field) for config_field in _own_config_fields()],
    namespace={"_argument_group_name": "DDLmHCConfig fields (JSON values: 4, 1e-3, true, null, {...})"},
)


@dataclasses.dataclass
class ModelArguments:
    """Where the model and tokenizer come from (run_clm's names)."""

    _argument_group_name = "model"

    model_name_or_path: str | None = dataclasses.field(
        default=None,
        metadata={
            "help": "a saved DDL-mHC folder, or a Llama (folder, Hub id, .gguf) converted with the config "
            "flags given as overrides; default: a new model from the config flags"
        },
    )
    tokenizer_name: str | None = dataclasses.field(
        default=None,
        metadata={"help": "default: the model folder's tokenizer, else a character tokenizer over the text"},
    )
    threads: int = dataclasses.field(default=DEFAULT_THREADS, metadata={"help": THREADS_HELP})


@dataclasses.dataclass
class DataTrainingArguments:
    """The text and its blocks (run_clm's names), and the sample printed at the end."""

    _argument_group_name = "data"

    dataset_name: str | None = dataclasses.field(
        default=TINY_SHAKESPEARE_HUB_NAME, metadata={"help": "a Hub dataset id (ignored with --train_file)"}
    )
    dataset_config_name: str | None = None
    train_file: str | None = dataclasses.field(default=None, metadata={"help": "a local UTF-8 text file"})
    validation_file: str | None = dataclasses.field(default=None, metadata={"help": "a local text file"})
    validation_split_percentage: int = dataclasses.field(
        default=10, metadata={"help": "%% of train held out when the data has no validation split"}
    )
    text_column: str = "text"
    block_size: int = dataclasses.field(default=64, metadata={"help": "tokens per packed block"})
    streaming: bool = dataclasses.field(
        default=False, metadata={"help": "stream the data (needs a tokenizer: --tokenizer_name or a model)"}
    )
    max_eval_samples: int | None = dataclasses.field(default=None, metadata={"help": "cap on eval blocks"})
    sample_tokens: int = dataclasses.field(
        default=300, metadata={"help": "tokens sampled at the end (0: none)"}
    )
    temperature: float = dataclasses.field(default=0.8, metadata={"help": "of the sample"})


def make_parser() -> CheckedParser:
    parser = CheckedParser((ModelArguments, DataTrainingArguments, ConfigArguments, TrainingArguments))
    parser.description = __doc__
    parser.set_defaults(**TRAINING_DEFAULTS)
    return parser


def parse_args(argv: list[str] | None = None):
    """(model, data, config arguments, config overrides, training arguments), every value checked before
    anything is loaded (a bad one exits naming its flag); the overrides are the config flags given."""
    parser = make_parser()
    model_args, data_args, config_args, training_args = parser.parse_args_into_dataclasses(argv)
    parser.checked(check_data_flags, data_args, model_args, training_args)
    given = {word[2:].split("=")[0] for word in (sys.argv[1:] if argv is None else argv) if word[:2] == "--"}
    overrides = {name: value for name, value in vars(config_args).items() if name in given}
    return model_args, data_args, config_args, overrides, training_args


def check_data_flags(data_args, model_args, training_args) -> None:
    check_flag("validation_split_percentage", data_args.validation_split_percentage, 0, 99, integer=True)
    check_flag("sample_tokens", data_args.sample_tokens, 0, integer=True)
    check_flag("temperature", data_args.temperature, 0.0, low_open=True)
    if data_args.train_file is None and data_args.dataset_name is None:
        raise ValueError("give --dataset_name or --train_file")
    for flag in ("train_file", "validation_file"):
        path = getattr(data_args, flag)
        if path is not None and not Path(path).is_file():
            raise ValueError(f"--{flag} {path!r} is not a file")
    if data_args.streaming and training_args.max_steps <= 0:
        raise ValueError("--streaming needs --max_steps >= 1 (a stream has no length)")
    if data_args.streaming and model_args.tokenizer_name is None and model_args.model_name_or_path is None:
        raise ValueError("--streaming needs --tokenizer_name or --model_name_or_path (no pass over the text)")


# ----------------------------------------------------------------------------------------------
# Data


def load_raw(data_args: DataTrainingArguments):
    """`train` (and `validation`) text splits; a corpus without a validation split holds out its first
    `--validation_split_percentage` % of train (run_clm), unless streamed."""
    if data_args.train_file is not None:
        files = {"train": data_args.train_file}
        if data_args.validation_file is not None:
            files["validation"] = data_args.validation_file
        name, config_name, kwargs = "text", None, {"data_files": files, "keep_linebreaks": True}
        raw = datasets.load_dataset(name, streaming=data_args.streaming, **kwargs)
    else:
        name, config_name, kwargs = data_args.dataset_name, data_args.dataset_config_name, {}
        with exit_without_data("--train_file FILE (a local text file)"):
            raw = load_hub_dataset(name, config_name, streaming=data_args.streaming)
    if "validation" in raw or data_args.streaming:
        return raw
    percent = data_args.validation_split_percentage
    return datasets.DatasetDict(
        {
            "train": datasets.load_dataset(name, config_name, split=f"train[{percent}%:]", **kwargs),
            "validation": datasets.load_dataset(name, config_name, split=f"train[:{percent}%]", **kwargs),
        }
    )


def load_tokenizer(model_args: ModelArguments, raw, text_column: str):
    """`--tokenizer_name`'s, else the model's (folder, Hub id, `.gguf`), else a character tokenizer over
    every split of the text."""
    source = model_args.tokenizer_name or model_args.model_name_or_path
    if source is not None:
        return load_pretrained_tokenizer(source)
    return build_char_tokenizer("".join(chain.from_iterable(split[text_column] for split in raw.values())))


def report_unknown_characters(tokenizer, texts: list[str], ids: list[list[int]], split: str) -> None:
    """A warning naming the characters of `split` that became the unknown token, with their counts and
    share of the tokens (a tokenizer built on another text meets new characters here)."""
    unk_id = tokenizer.unk_token_id
    num_unknown = 0 if unk_id is None else sum(row.count(unk_id) for row in ids)
    if num_unknown:
        shown = listed(unknown_characters(tokenizer, "".join(texts)))
        total = sum(len(row) for row in ids)
        logger.warning(
            f"{num_unknown:,} of the {total:,} tokens of the {split} split ({num_unknown / total:.2%}) are "
            f"{tokenizer.unk_token!r}: characters the tokenizer does not know: {shown}"
        )


def pack_blocks(raw, tokenizer, data_args: DataTrainingArguments):
    """Tokenise (no special tokens: one continuous text) and pack into `block_size` blocks whose `labels`
    are their `input_ids` (run_clm's `group_texts`; the remainder shorter than a block is dropped)."""
    block_size = data_args.block_size
    column = data_args.text_column

    def tokenize(batch: dict) -> dict:
        return tokenizer(batch[column], add_special_tokens=False, return_attention_mask=False, verbose=False)

    def group_texts(batch: dict) -> dict:
        ids = list(chain.from_iterable(batch["input_ids"]))
        total = len(ids) // block_size * block_size
        blocks = [ids[start : start + block_size] for start in range(0, total, block_size)]
        return {"input_ids": blocks, "labels": [list(block) for block in blocks]}

    packed = {}
    for split, rows in raw.items():
        names = rows.column_names if rows.column_names is not None else [column]
        if column not in names:
            raise ValueError(f"--text_column {column!r} is not a column of {split}; columns are {names}")
        tokenized = rows.map(tokenize, batched=True, remove_columns=names)
        if not data_args.streaming:
            report_unknown_characters(tokenizer, rows[column], tokenized["input_ids"], split)
        packed[split] = tokenized.map(group_texts, batched=True)
        if not data_args.streaming and len(packed[split]) == 0:
            raise ValueError(f"the {split} split has less than one block of --block_size={block_size} tokens")
    return packed


# ----------------------------------------------------------------------------------------------
# Model


def config_from_args(args, tokenizer, block_size: int) -> DDLmHCConfig:
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


def load_model(model_args: ModelArguments, config_args, overrides: dict, tokenizer, block_size: int):
    """A new model from the config flags, a saved DDL-mHC folder, or a converted Llama (module docstring);
    `overrides`: the config flags given, of which those that differ from the source's config count."""
    source = model_args.model_name_or_path
    if source is None:
        return geoformers.DDLmHCForCausalLM(config_from_args(config_args, tokenizer, block_size))
    if Path(source).suffix == ".gguf":
        return geoformers.convert_llama_to_ddl_mhc(source, **overrides)
    config = AutoConfig.from_pretrained(source)
    changed = {name: value for name, value in overrides.items() if getattr(config, name, None) != value}
    if config.model_type != "ddl_mhc":
        return geoformers.convert_llama_to_ddl_mhc(source, **changed)
    if changed:
        raise ValueError(f"config flags {sorted(changed)} cannot change the saved DDL-mHC model {source}")
    return AutoModelForCausalLM.from_pretrained(source)


def trained_settings(training_args: TrainingArguments) -> dict:
    """The training flags a result file records: the script's defaults and those given away from
    `TrainingArguments`' defaults, and the number of processes."""
    kept = {
        name: value
        for name, value in training_args.to_dict().items()
        if name in TRAINING_DEFAULTS or value != TRAINING_FIELD_DEFAULTS.get(name)
    }
    return {**kept, "world_size": training_args.world_size}


def resume_value(text: str | None):
    """`--resume_from_checkpoint`: `true` is the Trainer's True (the newest checkpoint of --output_dir)."""
    if text is not None and text.lower() in ("true", "false"):
        return text.lower() == "true" or None
    return text


# ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    model_args, data_args, config_args, overrides, training_args = parse_args(argv)
    set_threads(model_args.threads)
    set_seed(training_args.seed)  # before the model is initialised (run_clm)
    raw = load_raw(data_args)
    tokenizer = load_tokenizer(model_args, raw, data_args.text_column)
    with training_args.main_process_first(desc="tokenising and packing"):
        blocks = pack_blocks(raw, tokenizer, data_args)
    eval_dataset = blocks.get("validation")
    if eval_dataset is not None and data_args.max_eval_samples is not None:
        eval_dataset = eval_dataset.take(data_args.max_eval_samples)
    if not (training_args.eval_strategy != "no" or training_args.do_eval):
        eval_dataset = None
    elif eval_dataset is None:
        raise ValueError("no validation split to evaluate on: pass --validation_file, or --eval_strategy no")
    model = load_model(model_args, config_args, overrides, tokenizer, data_args.block_size)
    if training_args.should_log:
        print(f"{model.num_parameters():,} parameters; config: {model.config.to_json_string(use_diff=True)}")
    trainer = build_lm_trainer(
        model,
        training_args,
        blocks["train"],
        eval_dataset,
        tokenizer=tokenizer,
    )
    result = trainer.train(resume_from_checkpoint=resume_value(training_args.resume_from_checkpoint))
    trainer.save_model()
    metrics = dict(result.metrics)
    if trainer.eval_dataset is not None:
        evaluations = [entry for entry in trainer.state.log_history if "eval_loss" in entry]
        done = evaluations and evaluations[-1]["step"] == trainer.state.global_step
        metrics.update(evaluations[-1] if done else trainer.evaluate())  # the final model's, once
    trainer.log_metrics("final", metrics)
    trainer.save_metrics("all", metrics)
    trainer.save_state()
    if not trainer.is_world_process_zero():
        return metrics
    if data_args.sample_tokens:
        model.eval()
        prompt = torch.tensor([[tokenizer.bos_token_id]], device=model.device)
        sample = model.generate(
            prompt,
            max_new_tokens=data_args.sample_tokens,
            do_sample=True,
            temperature=data_args.temperature,
            pad_token_id=tokenizer.pad_token_id,
        )
        print("--- sample ---")
        print(tokenizer.decode(sample[0, 1:], skip_special_tokens=True))
    settings = {**vars(model_args), **vars(data_args), **overrides, **trained_settings(training_args)}
    write_results(
        Path(training_args.output_dir) / "training_history.json",
        "train_causal_lm.py",
        argv,
        settings,
        {"metrics": metrics, "log_history": trainer.state.log_history},
    )
    return metrics


if __name__ == "__main__":
    main()

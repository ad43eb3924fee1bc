"""BERT-style WordPiece: trained on a classification split, or loaded from a local BERT vocabulary."""

import itertools
import json
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, BertTokenizer, PreTrainedTokenizerFast
from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

from geoformers.tokenization.arguments import Corpus, require_int

BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BERT_MAX_LENGTH = 512
CHUNK_TEXTS = 1000
PRIVATE_USE_START = 0xF0000
TOKENIZER_JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _word_counts(corpus: Corpus, normalizer: normalizers.Normalizer) -> Counter:
    """Words after BERT normalisation and pre-tokenisation, counted (texts joined in chunks: fewer calls)."""
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    counts = Counter()
    texts = iter(corpus)
    while chunk := list(itertools.islice(texts, CHUNK_TEXTS)):
        words = pre_tokenizer.pre_tokenize_str(normalizer.normalize_str("\n".join(chunk)))
        counts.update(word for word, _ in words)
    return counts


def _learn_wordpiece_vocab(counts: Counter, vocab_size: int, min_frequency: int) -> dict[str, int]:
    """WordPiece vocabulary by BPE merges over words whose non-initial characters are marked as `##` pieces.

    Same algorithm as `tokenizers.trainers.WordPieceTrainer` (a BPE trainer with a `##` continuation
    prefix), but deterministic: that trainer numbers the `##` symbols in hash-map order, which changes its
    merge tie-breaks from run to run (huggingface/tokenizers#1794). Here each continuation character is a
    private-use code point numbered in sorted order, so the plain BPE trainer sees a fixed alphabet.
    """
    characters = sorted({character for word in counts for character in word})
    continuation_characters = sorted({character for word in counts for character in word[1:]})
    taken = set(characters)
    free_code_points = (chr(code) for code in itertools.count(PRIVATE_USE_START) if chr(code) not in taken)
    marked = dict(zip(continuation_characters, free_code_points, strict=False))
    unmarked = {code_point: character for character, code_point in marked.items()}

    def marked_words():
        for word, count in counts.items():
            yield [word[0] + "".join(marked[character] for character in word[1:])] * count

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(BERT_SPECIAL_TOKENS),
        initial_alphabet=characters + list(marked.values()),
        show_progress=False,
    )
    backend.train_from_iterator(marked_words(), trainer=trainer)
    vocab = {}
    for token, index in backend.get_vocab().items():
        if token in BERT_SPECIAL_TOKENS:
            vocab[token] = index
        elif token[0] in unmarked:
            vocab["##" + "".join(unmarked[symbol] for symbol in token)] = index
        else:
            vocab["".join(unmarked.get(symbol, symbol) for symbol in token)] = index
    return vocab


def train_wordpiece(
    texts: Iterable[str],
    vocab_size: int,
    lowercase: bool = True,
    *,
    min_frequency: int = 2,
    model_max_length: int = BERT_MAX_LENGTH,
) -> PreTrainedTokenizerFast:
    """Train a WordPiece vocabulary on `texts`, returned as a `BertTokenizer` (a `PreTrainedTokenizerFast`).

    BERT's pipeline: `BertNormalizer` (lowercasing and accent stripping iff `lowercase`), `BertPreTokenizer`,
    `##` continuation prefix, post-processor `[CLS] x [SEP]` (pairs: `[CLS] a [SEP] b [SEP]`). Ids 0..4 are
    `[PAD] [UNK] [CLS] [SEP] [MASK]`. Encodings hold `input_ids` and `attention_mask` only (the project's
    encoders take no `token_type_ids`). The same texts always give the same vocabulary.
    """
    corpus = Corpus(texts)
    require_int("vocab_size", vocab_size, len(BERT_SPECIAL_TOKENS) + 1)
    if not isinstance(lowercase, bool):
        raise TypeError(f"lowercase must be a bool, got {type(lowercase).__name__}")
    require_int("min_frequency", min_frequency, 1)
    require_int("model_max_length", model_max_length, 1)
    counts = _word_counts(corpus, normalizers.BertNormalizer(lowercase=lowercase))
    if corpus.num_documents == 0:
        raise ValueError("texts is empty: WordPiece needs at least one sentence to learn a vocabulary from")
    return BertTokenizer(
        vocab=_learn_wordpiece_vocab(counts, vocab_size, min_frequency),
        do_lower_case=lowercase,
        model_max_length=model_max_length,
        model_input_names=["input_ids", "attention_mask"],
    )


def load_bert_tokenizer(
    folder: str | os.PathLike, *, model_max_length: int | None = None
) -> PreTrainedTokenizerFast:
    """Load the WordPiece tokenizer of a local BERT checkpoint folder, offline.

    The folder holds a saved tokenizer (`tokenizer.json` / `tokenizer_config.json`) or only BERT's
    `vocab.txt` (then uncased BERT defaults apply). `model_max_length` overrides the folder's value; when
    neither sets one, BERT's 512 applies.
    """
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be a path, got {type(folder).__name__}")
    if model_max_length is not None:
        require_int("model_max_length", model_max_length, 1)
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"folder {str(folder)!r} is not a directory")
    if (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file():
        _check_json_files(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    elif (folder / "vocab.txt").is_file():
        tokenizer = BertTokenizer.from_pretrained(folder, local_files_only=True)
    else:
        raise FileNotFoundError(
            f"folder {str(folder)!r} holds none of tokenizer.json, tokenizer_config.json, vocab.txt"
        )
    backend_model = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
    if not isinstance(tokenizer, PreTrainedTokenizerFast) or not isinstance(backend_model, models.WordPiece):
        raise ValueError(f"folder {str(folder)!r} does not hold a WordPiece (BERT) tokenizer")
    if model_max_length is not None:
        tokenizer.model_max_length = model_max_length
    elif tokenizer.model_max_length >= VERY_LARGE_INTEGER:
        tokenizer.model_max_length = BERT_MAX_LENGTH
    return tokenizer


def _check_json_files(folder: Path) -> None:
    """The tokenizer's JSON files in `folder` parse: a truncated or hand-edited one is named (transformers
    raises a bare JSONDecodeError that names no file)."""
    for name in TOKENIZER_JSON_FILES:
        path = folder / name
        if path.is_file():
            try:
                json.loads(path.read_bytes())
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                message = f"{str(path)!r} is not valid JSON (truncated or edited?): {error}"
                raise ValueError(message) from error

"""geoformers.tokenization: build, save and load the fast tokenizers that ship with checkpoints. The names
load on first access (PEP 562)."""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from geoformers.tokenization.bpe_tokenizer import train_byte_level_bpe
    from geoformers.tokenization.char_tokenizer import build_char_tokenizer
    from geoformers.tokenization.encoding import encode_text, unknown_characters
    from geoformers.tokenization.kmer_tokenizer import build_kmer_tokenizer, kmerize
    from geoformers.tokenization.wordpiece_tokenizer import load_bert_tokenizer, train_wordpiece

# name -> the module that defines it
_LAZY = {
    "build_char_tokenizer": "geoformers.tokenization.char_tokenizer",
    "build_kmer_tokenizer": "geoformers.tokenization.kmer_tokenizer",
    "encode_text": "geoformers.tokenization.encoding",
    "kmerize": "geoformers.tokenization.kmer_tokenizer",
    "load_bert_tokenizer": "geoformers.tokenization.wordpiece_tokenizer",
    "train_byte_level_bpe": "geoformers.tokenization.bpe_tokenizer",
    "train_wordpiece": "geoformers.tokenization.wordpiece_tokenizer",
    "unknown_characters": "geoformers.tokenization.encoding",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "build_char_tokenizer",
    "build_kmer_tokenizer",
    "encode_text",
    "kmerize",
    "load_bert_tokenizer",
    "train_byte_level_bpe",
    "train_wordpiece",
    "unknown_characters",
]

"""geoformers.tokenization: build, save and load the fast tokenizers that ship with checkpoints."""

from geoformers.tokenization.bpe_tokenizer import train_byte_level_bpe
from geoformers.tokenization.char_tokenizer import build_char_tokenizer
from geoformers.tokenization.kmer_tokenizer import build_kmer_tokenizer, kmerize
from geoformers.tokenization.wordpiece_tokenizer import load_bert_tokenizer, train_wordpiece

__all__ = [
    "build_char_tokenizer",
    "build_kmer_tokenizer",
    "kmerize",
    "load_bert_tokenizer",
    "train_byte_level_bpe",
    "train_wordpiece",
]

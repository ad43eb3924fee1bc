"""Nucleotide k-mer tokenizer (word level over all ACGT k-mers) for genome classification tasks."""

import itertools

from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from geoformers.tokenization.arguments import require_int
from geoformers.tokenization.wordpiece_tokenizer import BERT_SPECIAL_TOKENS

NUCLEOTIDES = "ACGT"
AMBIGUOUS_BASE = "N"
MAX_KMER_SIZE = 8


def kmerize(sequence: str, kmer_size: int, stride: int | None = None) -> str:
    """Space-separated k-mers of `sequence` at offsets 0, stride, 2 stride, ... (stride default: kmer_size).

    The k-mer tokenizer's input: `tokenizer(kmerize(genome, k, stride))`. A tail shorter than kmer_size is
    dropped.
    """
    if not isinstance(sequence, str):
        raise TypeError(f"sequence must be a str, got {type(sequence).__name__}")
    require_int("kmer_size", kmer_size, 1)
    stride = kmer_size if stride is None else require_int("stride", stride, 1)
    sequence = sequence.upper()
    unknown = set(sequence) - set(NUCLEOTIDES + AMBIGUOUS_BASE)
    if unknown:
        raise ValueError(f"sequence holds characters outside ACGTN: {sorted(unknown)}")
    if len(sequence) < kmer_size:
        raise ValueError(f"sequence (length {len(sequence)}) is shorter than kmer_size={kmer_size}")
    starts = range(0, len(sequence) - kmer_size + 1, stride)
    return " ".join(sequence[start : start + kmer_size] for start in starts)


def build_kmer_tokenizer(kmer_size: int, *, model_max_length: int = 4096) -> PreTrainedTokenizerFast:
    """Word-level tokenizer over the 4**kmer_size ACGT k-mers, with BERT's special tokens and `[CLS] x [SEP]`.

    Ids 0..4 are `[PAD] [UNK] [CLS] [SEP] [MASK]`; k-mer ids follow in lexicographic order (A<C<G<T), so the
    id of k-mer b_1..b_k is 5 + sum_j index(b_j) 4**(k-j). A k-mer holding N (or any other symbol) is `[UNK]`.
    Input is `kmerize(...)` text; decoding gives the space-separated k-mers back.
    """
    require_int("kmer_size", kmer_size, 1)
    if kmer_size > MAX_KMER_SIZE:
        raise ValueError(f"kmer_size must be <= {MAX_KMER_SIZE} (vocabulary 4**kmer_size), got {kmer_size}")
    require_int("model_max_length", model_max_length, 3)
    kmers = ("".join(bases) for bases in itertools.product(NUCLEOTIDES, repeat=kmer_size))
    vocabulary = list(BERT_SPECIAL_TOKENS) + list(kmers)
    word_level = models.WordLevel({token: index for index, token in enumerate(vocabulary)}, unk_token="[UNK]")
    backend = Tokenizer(word_level)
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocabulary.index("[CLS]")), ("[SEP]", vocabulary.index("[SEP]"))],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=model_max_length,
        model_input_names=["input_ids", "attention_mask"],
        clean_up_tokenization_spaces=False,
    )

"""Byte-level BPE (GPT-2 style) trained on a corpus, as a fast tokenizer."""

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from geoformers.tokenization.arguments import Corpus, require_int

END_OF_TEXT = "<|endoftext|>"
PAD = "<pad>"
BPE_SPECIAL_TOKENS = (END_OF_TEXT, PAD)
NUM_BYTES = 256


def train_byte_level_bpe(
    texts: Iterable[str],
    vocab_size: int,
    *,
    min_frequency: int = 2,
    model_max_length: int = 1024,
    show_progress: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts`; decode(encode(s)) == s for any str s (all 256 bytes are tokens).

    Ids: `<|endoftext|>` = 0 (bos, eos and unk, GPT-2 convention), `<pad>` = 1 (distinct from eos, so a
    language-model collator that masks pad labels keeps eos), then the 256 byte symbols, then the merges.
    No prefix space is added and no special tokens are added on encode.
    """
    corpus = Corpus(texts)
    require_int("vocab_size", vocab_size, len(BPE_SPECIAL_TOKENS) + NUM_BYTES)
    require_int("min_frequency", min_frequency, 1)
    require_int("model_max_length", model_max_length, 1)
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(BPE_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    backend.train_from_iterator(corpus, trainer=trainer)
    if corpus.num_documents == 0:
        raise ValueError("texts is empty: byte-level BPE needs at least one document to learn merges from")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        unk_token=END_OF_TEXT,
        pad_token=PAD,
        model_max_length=model_max_length,
        model_input_names=["input_ids", "attention_mask"],
        clean_up_tokenization_spaces=False,
    )

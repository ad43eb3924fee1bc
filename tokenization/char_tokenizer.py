"""Character-level tokenizer for small corpora (nanoGPT `shakespeare_char` style), as a fast tokenizer."""

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.utils import logging

from geoformers.tokenization.arguments import require_int

logger = logging.get_logger(f"transformers.{__name__}")

END_OF_TEXT = "<|endoftext|>"
PAD = "<pad>"
UNK = "<unk>"
CHAR_SPECIAL_TOKENS = (END_OF_TEXT, PAD, UNK)


def build_char_tokenizer(text: str, *, model_max_length: int = 1024) -> PreTrainedTokenizerFast:
    """One token per Unicode character of `text`; decode(encode(s)) == s for every s over those characters.

    Ids: `<|endoftext|>` = 0 (bos and eos, GPT-2 convention), `<pad>` = 1, `<unk>` = 2, then the sorted
    unique characters of `text`. Characters absent from `text` encode to `<unk>`; a special-token string in
    the input (e.g. "<pad>") encodes to that token. No normalisation, no special tokens added on encode, and
    a `Fuse` decoder (with no decoder, `tokenizers` joins tokens with spaces). Logs (info) the alphabet it
    covers; `geoformers.tokenization.encode_text` reports the characters of another text that become `<unk>`.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not text:
        raise ValueError("text is empty: the vocabulary is built from its characters")
    require_int("model_max_length", model_max_length, 1)
    alphabet = sorted(set(text))
    vocabulary = list(CHAR_SPECIAL_TOKENS) + alphabet
    logger.info(
        f"character tokenizer: the {len(alphabet)} distinct characters of a text of {len(text):,} and "
        f"{len(CHAR_SPECIAL_TOKENS)} special tokens; any other character encodes to {UNK!r}"
    )
    word_level = models.WordLevel({token: index for index, token in enumerate(vocabulary)}, unk_token=UNK)
    backend = Tokenizer(word_level)
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        pad_token=PAD,
        unk_token=UNK,
        model_max_length=model_max_length,
        model_input_names=["input_ids", "attention_mask"],
        clean_up_tokenization_spaces=False,
    )

"""Characters a tokenizer does not know: counted and reported when text is encoded, instead of silently
becoming the unknown token (a character tokenizer built on one text meets new characters in another)."""

from collections import Counter

from transformers import PreTrainedTokenizerBase
from transformers.utils import logging

# a child of transformers' library logger: shown by default (warnings), silenced by its verbosity settings
logger = logging.get_logger(f"transformers.{__name__}")
SHOWN = 10  # unknown characters listed in a report, most frequent first


def unknown_characters(tokenizer: PreTrainedTokenizerBase, text: str) -> Counter:
    """The characters of `text` that `tokenizer` encodes to its unknown token, with their counts (empty when
    the tokenizer has no unknown token, e.g. byte-level BPE)."""
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise TypeError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    unk_id = tokenizer.unk_token_id
    counts = Counter(text)
    if unk_id is None or not counts:
        return Counter()
    characters = sorted(counts)
    encoded = tokenizer(characters, add_special_tokens=False, verbose=False)["input_ids"]
    return Counter({c: counts[c] for c, ids in zip(characters, encoded, strict=True) if ids == [unk_id]})


def listed(unknown: Counter) -> str:
    """The `SHOWN` most frequent unknown characters with their counts, e.g. "'x' x3, 'ñ' x1 and 2 more"."""
    shown = ", ".join(f"{character!r} x{count:,}" for character, count in unknown.most_common(SHOWN))
    return shown + (f" and {len(unknown) - SHOWN} more" if len(unknown) > SHOWN else "")


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str, *, name: str = "the text") -> list[int]:
    """Token ids of `text` (no special tokens added, no length warning: a corpus is cut into blocks later);
    a warning names every character that became the unknown token, with its count and share of the
    tokens."""
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    unknown = unknown_characters(tokenizer, text)
    if unknown:
        total = sum(unknown.values())
        logger.warning(
            f"{total:,} characters of {name} ({len(unknown)} distinct) are not in the tokenizer's "
            f"vocabulary and became {tokenizer.unk_token!r}, {total / max(len(ids), 1):.2%} of its "
            f"{len(ids):,} tokens: {listed(unknown)}"
        )
    return ids

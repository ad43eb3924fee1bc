"""Argument checks shared by the tokenizer builders: a streamed str corpus and integer sizes."""

from collections.abc import Iterable, Iterator


def require_int(name: str, value: object, minimum: int) -> int:
    """Return `value` if it is an int (not a bool) >= `minimum`, else raise ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


class Corpus:
    """`texts` (an iterable of str) for `Tokenizer.train_from_iterator`, counting the documents it yields."""

    def __init__(self, texts: Iterable[str]):
        if isinstance(texts, str) or not isinstance(texts, Iterable):
            raise TypeError(f"texts must be an iterable of str documents, got {type(texts).__name__}")
        self.texts = texts
        self.num_documents = 0

    def __iter__(self) -> Iterator[str]:
        for text in self.texts:
            if not isinstance(text, str):
                raise TypeError(f"texts must hold str items, got {type(text).__name__}")
            self.num_documents += 1
            yield text

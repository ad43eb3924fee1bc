"""A Hub dataset that cannot be loaded ends a script in one line naming the dataset and the flag that takes
a local copy (`geoformers.training.data.HubDatasetUnavailable`), not in a traceback after retries."""

from contextlib import contextmanager

from geoformers.training.data import HubDatasetUnavailable

# the scripts' flags that take a local copy of the canonical datasets (docs/experiments.md, 'Data')
DATA_FLAG = "--data FILE (a local UTF-8 text file, e.g. tiny-shakespeare's input.txt)"
DATA_DIR_FLAG = "--data_dir DIR (a folder with GLUE's SST-2 train.tsv and dev.tsv)"


@contextmanager
def exit_without_data(flag: str):
    """Turn `HubDatasetUnavailable` inside the block into `SystemExit` (exit status 1) with a message naming
    the dataset and `flag`."""
    try:
        yield
    except HubDatasetUnavailable as error:
        raise SystemExit(
            f"error: cannot load the Hub dataset {error.dataset!r} ({error.reason}); "
            f"pass a local copy with {flag}"
        ) from None

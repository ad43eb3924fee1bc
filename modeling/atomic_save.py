"""Atomic folder saves: a model folder holds the complete old save or the complete new one, never a mix.

`save_pretrained` writes into a fresh hidden sibling folder `.<name>.saving-<random>`, adds the old folder's
other files (tokenizer, checkpoints, ...) as hard links, and only then swaps the two folders
(`replace_folder`): on Linux with one `renameat2(RENAME_EXCHANGE)` call, elsewhere with two renames (old
folder aside, new folder in), between which the folder is briefly absent and loading it fails with "not
found". A process killed at any point before the swap leaves the old folder untouched (and a stale
`.<name>.saving-*` sibling that may be deleted); after the swap the new folder is complete. Old weight files
of the same name stem as the new ones (e.g. `model-00001-of-00002.safetensors` under a new unsharded
`model.safetensors`) are not carried over, so no stale shard can be loaded with the new config.
"""

import ctypes
import errno
import inspect
import os
import re
import secrets
import shutil
from pathlib import Path

from transformers import PreTrainedModel

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_WEIGHTS_FILE = re.compile(r"(?P<stem>.+?)(?:-\d{5}-of-\d{5})?\.safetensors(?:\.index\.json)?")
_ATOMIC_SAVE_SIGNATURE = inspect.signature(PreTrainedModel.save_pretrained)


def _exchange_paths(first: Path, second: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux `renameat2` with RENAME_EXCHANGE); False where the
    platform or filesystem does not offer it."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError, TypeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(first), None, str(second))


def _fsync_tree(folder: Path) -> None:
    """Flush every file and directory under `folder` to disk, so the swap never publishes unwritten data."""
    for path in sorted(folder.rglob("*"), reverse=True) + [folder]:
        if path.is_symlink():
            continue
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        except OSError:  # some filesystems refuse fsync on directories
            pass
        finally:
            os.close(descriptor)


def link_or_copy(source: str, destination: str) -> None:
    """Hard-link `source` to `destination`, or copy it where the filesystem has no hard links."""
    try:
        os.link(source, destination)
    except OSError:  # no hard links on this filesystem
        shutil.copy2(source, destination)


def staging_folder(target: Path) -> Path:
    """A new empty hidden sibling of `target` to build its replacement in (same filesystem, so renames are
    atomic), with the permissions of an existing `target`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.saving-{secrets.token_hex(6)}")
    staging.mkdir()
    if target.is_dir():
        shutil.copymode(target, staging)
    return staging


def replace_folder(staging: Path, target: Path) -> None:
    """Publish the complete folder `staging` as `target`, deleting the folder it replaces."""
    _fsync_tree(staging)
    if not target.exists():
        os.rename(staging, target)
    elif _exchange_paths(staging, target):
        shutil.rmtree(staging)  # now the old folder
    else:
        aside = target.with_name(f".{target.name}.replaced-{secrets.token_hex(6)}")
        os.rename(target, aside)
        os.rename(staging, target)
        shutil.rmtree(aside)


def carry_over(old: Path, staging: Path) -> None:
    """Hard-link (or copy) into `staging` every entry of `old` that the new save did not write, except old
    weight files of a name stem the new save wrote."""
    written = {path.name for path in staging.iterdir()}
    new_stems = {match["stem"] for name in written if (match := _WEIGHTS_FILE.fullmatch(name))}
    for entry in old.iterdir():
        match = _WEIGHTS_FILE.fullmatch(entry.name)
        if entry.name in written or (match is not None and match["stem"] in new_stems):
            continue
        destination = staging / entry.name
        if entry.is_symlink():
            os.symlink(os.readlink(entry), destination)
        elif entry.is_dir():
            shutil.copytree(entry, destination, symlinks=True, copy_function=link_or_copy)
        else:
            link_or_copy(str(entry), str(destination))


class AtomicSaveMixin:
    """`save_pretrained` that replaces the target folder atomically (module docstring). Saves that write on
    other ranks, push to the Hub or write a distributed checkpoint take transformers' own path unchanged."""

    def save_pretrained(self, save_directory, *args, **kwargs):
        arguments = _ATOMIC_SAVE_SIGNATURE.bind(self, save_directory, *args, **kwargs).arguments
        target = Path(os.path.realpath(save_directory))
        writes_here = self.should_save_on_this_rank(arguments.get("is_main_process", True))
        stock = arguments.get("push_to_hub") or arguments.get("distributed_checkpoint")
        if target.is_file() or not writes_here or stock:
            return super().save_pretrained(save_directory, *args, **kwargs)
        staging = staging_folder(target)
        try:
            result = super().save_pretrained(staging, *args, **kwargs)
            if target.is_dir():
                carry_over(target, staging)
            replace_folder(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return result


__all__ = ["AtomicSaveMixin", "carry_over", "link_or_copy", "replace_folder", "staging_folder"]

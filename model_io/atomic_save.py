"""Atomic folder saves (docs/reliability.md, 'Saving'): a model folder holds the complete old save or the
complete new one, never a mix.

`atomic_save_pretrained` runs transformers' own save into a fresh hidden sibling folder
`.<name>.saving-<random>`, adds the old folder's other files (tokenizer, checkpoints, ...) as hard links, and
only then puts it in place with two renames (old folder aside, new folder in), between which the folder is
briefly absent and loading it fails with "not found". A process killed at any point before the first rename
leaves the old folder untouched (and a stale `.<name>.saving-*` sibling that may be deleted); one killed
between the renames leaves no folder (and the old one complete as `.<name>.replaced-*`); after the second the
new folder is complete. Old weight files of the same name stem as the new ones (e.g.
`model-00001-of-00002.safetensors` under a new unsharded `model.safetensors`) are not carried over, so no
stale shard can be loaded with the new config. The weight files get the permissions the umask gives to
config.json (safetensors creates them 0600). With `push_to_hub=True` the files this save wrote are then
uploaded, as transformers does.
"""

import inspect
import os
import re
import secrets
import shutil
from pathlib import Path

from huggingface_hub import HfApi
from transformers import PreTrainedModel

_WEIGHTS_FILE = re.compile(r"(?P<stem>.+?)(?:-\d{5}-of-\d{5})?\.safetensors(?:\.index\.json)?")
SAVE_SIGNATURE = inspect.signature(PreTrainedModel.save_pretrained)


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
    if not target.exists():
        os.rename(staging, target)
        return
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


def _follow_umask(folder: Path) -> None:
    """Give the weight files the mode of config.json, which transformers opens under the process' umask."""
    config = folder / "config.json"
    if config.is_file():
        mode = config.stat().st_mode & 0o777
        for path in folder.glob("*.safetensors"):
            path.chmod(mode)


def atomic_save_pretrained(model, save, save_directory, *args, **kwargs):
    """`save(save_directory, *args, **kwargs)` (transformers' `save_pretrained` of `model`, bound) made
    atomic (module docstring). Saves that write on other ranks or write a distributed checkpoint take
    transformers' own path unchanged."""
    arguments = dict(SAVE_SIGNATURE.bind(model, save_directory, *args, **kwargs).arguments)
    target = Path(os.path.realpath(save_directory))
    writes_here = model.should_save_on_this_rank(arguments.get("is_main_process", True))
    if target.is_file() or not writes_here or arguments.get("distributed_checkpoint"):
        return save(save_directory, *args, **kwargs)
    arguments.pop("self")
    arguments.pop("save_directory")
    extra = arguments.pop("kwargs", {})
    push = arguments.pop("push_to_hub", False)
    if push:  # as transformers: hub arguments from **kwargs, the rest of them for `create_repo`
        api, token = HfApi(), arguments.get("token")
        commit_message, create_pr = extra.pop("commit_message", None), extra.pop("create_pr", False)
        repo_id = api.create_repo(
            extra.pop("repo_id", Path(save_directory).name), exist_ok=True, token=token, **extra
        ).repo_id
        extra = {}
    staging = staging_folder(target)
    try:
        result = save(staging, **arguments, **extra)
        _follow_umask(staging)
        written = sorted(path.name for path in staging.iterdir())
        if target.is_dir():
            carry_over(target, staging)
        replace_folder(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if push:
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=target,
            allow_patterns=written,
            token=token,
            commit_message=commit_message or "Upload model",
            create_pr=create_pr,
        )
    return result


__all__ = [
    "SAVE_SIGNATURE",
    "atomic_save_pretrained",
    "carry_over",
    "link_or_copy",
    "replace_folder",
    "staging_folder",
]

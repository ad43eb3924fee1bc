"""Complete Trainer checkpoints (docs/reliability.md, 'Complete checkpoints'): a completion marker written
last, checked before use, and incomplete checkpoints moved out of the stock resume's way.

`CompleteCheckpointsCallback.on_save` (and `IncrtGrowthCallback`, which extends it) runs after the Trainer
wrote `checkpoint-<step>` (model, optimizer, scheduler, RNG, trainer_state.json), flushes its files to disk
and writes `geoformers_checkpoint.json`: the step, the size and modification time (ns) of every file, and for
DDCL-INCRT the head counts. A checkpoint is complete when the marker parses, lists every file of the folder
(config.json, trainer_state.json and the weights among them), every file it lists has its recorded size and
modification time, and config.json holds its head counts (when the marker records them): an interrupted
save, a truncated file, a file written after the marker (bytes changed in place, files of another
checkpoint, a second run writing into the same folder), a marker rewritten by hand all fail the check, which
reads no file but the marker and config.json. Copies keep a checkpoint complete if they keep modification
times (`shutil.copytree`, `cp -p`, `rsync -a`). `checkpoint_problem` returns the reason instead of raising,
whatever the files contain.

transformers' `trainer.train(resume_from_checkpoint=True)` takes the `checkpoint-<step>` folder of highest
step (`get_last_checkpoint`), complete or not, before any callback event of `train()`. So the callback acts
when the Trainer is built (`on_init_end`): `hide_incomplete_checkpoints` renames every checkpoint newer than
the newest complete one to `.incomplete-checkpoint-<step>`, which `get_last_checkpoint` and the Trainer's
rotation ignore, and the stock call resumes from the newest complete one.

With `save_total_limit=1` the Trainer deletes the previous checkpoint before `on_save` marks the new one, so
after marking a checkpoint the callback keeps a hard-linked copy `.kept-checkpoint-<step>` of it (hidden from
the Trainer's rotation and `get_last_checkpoint`) until the next one is complete; `latest_complete_checkpoint`
considers these copies too, and `hide_incomplete_checkpoints` links the newest back as `checkpoint-<step>`
when it is the newest complete one.
"""

import json
import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
from transformers import TrainerCallback, TrainingArguments
from transformers.trainer_callback import TrainerControl, TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import logging

from geoformers.model_io.atomic_save import link_or_copy, staging_folder

logger = logging.get_logger(__name__)

MARKER_FILE = "geoformers_checkpoint.json"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
KEPT_PREFIX = ".kept-"
INCOMPLETE_PREFIX = ".incomplete-"
_CANDIDATE = re.compile(rf"(?P<kept>{re.escape(KEPT_PREFIX)})?{PREFIX_CHECKPOINT_DIR}-(?P<step>\d+)")


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    except OSError:  # some filesystems refuse fsync on directories
        pass
    finally:
        os.close(descriptor)


def _strict_json(value):
    """`value` with NaN/inf as None and numpy scalars as Python numbers: strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict_json(item) for item in value]
    if isinstance(value, np.generic):
        return _strict_json(value.item())
    return value


def write_json_atomically(path: str | os.PathLike, content: dict) -> None:
    """Indented strict JSON (NaN/inf written as null), written to a temporary file, flushed to disk, then
    renamed: a reader sees the old file or the whole new one, also after a crash or a kill mid-write."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(_strict_json(content), indent=2, allow_nan=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    _fsync(path.parent)


def write_marker(checkpoint: Path, global_step: int, num_heads: list[int] | None = None) -> None:
    """Flush every file of `checkpoint` to disk, then mark it complete: its step, every file's size and
    modification time, and the head counts when given (DDCL-INCRT)."""
    files = {}
    for path in sorted(checkpoint.rglob("*")):
        if path.is_file() and path.name != MARKER_FILE:
            _fsync(path)
            name, stat = path.relative_to(checkpoint).as_posix(), path.stat()
            files[name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    marker = {"global_step": global_step, "files": files}
    if num_heads is not None:
        marker["num_heads"] = list(num_heads)
    write_json_atomically(checkpoint / MARKER_FILE, marker)


def _read_json(path: Path):
    return json.loads(path.read_bytes().decode("utf-8"))


def _is_count_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _marker_problem(marker) -> str | None:
    """What is malformed in a parsed marker (None when its structure is valid)."""
    if not isinstance(marker, dict):
        return f"a JSON object was expected, got {type(marker).__name__}"
    step = marker.get("global_step")
    if isinstance(step, bool) or not isinstance(step, int):
        return f"`global_step` must be an int, got {step!r}"
    if "num_heads" in marker and not _is_count_list(marker["num_heads"]):
        return f"`num_heads` must be a list of ints, got {marker['num_heads']!r}"
    files = marker.get("files")
    if not isinstance(files, dict) or "config.json" not in files:
        return "`files` must map file names (config.json among them) to their size and modification time"
    for name, record in files.items():
        if Path(name).is_absolute() or ".." in Path(name).parts:
            return f"file name {name!r} points outside the checkpoint"
        if not (isinstance(record, dict) and _is_count_list([record.get("size"), record.get("mtime_ns")])):
            return f"the record of {name!r} must hold an int `size` and an int `mtime_ns`, got {record!r}"
    return None


def _unrecorded_files(checkpoint: Path, files: dict) -> str | None:
    """A marker lists every file of its checkpoint, the trainer state and the model weights among them: one
    rewritten by hand (or files added after the save) fails here rather than at resume."""
    for name in ("trainer_state.json",):
        if name not in files:
            return f"{MARKER_FILE} does not record {name} (rewritten by hand?)"
    if not any(name in files for name in WEIGHT_FILES):
        return f"{MARKER_FILE} records no model weights ({', '.join(WEIGHT_FILES)}; rewritten by hand?)"
    for path in sorted(checkpoint.rglob("*")):
        name = path.relative_to(checkpoint).as_posix()
        if path.is_file() and name != MARKER_FILE and name not in files:
            return f"{name} is in the checkpoint but not in {MARKER_FILE} (marker rewritten, or file added)"
    return None


def checkpoint_problem(checkpoint: str | os.PathLike) -> str | None:
    """Why `checkpoint` is not a complete checkpoint (None when it is; module docstring). Never raises for
    what the folder contains."""
    checkpoint = Path(checkpoint)
    contents = {}
    for name in (MARKER_FILE, "config.json"):
        try:
            contents[name] = _read_json(checkpoint / name)
        except FileNotFoundError:
            return f"{name} is missing (the save was interrupted?)"
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            return f"{name} is unreadable ({type(error).__name__}: {error})"
    marker, config = contents[MARKER_FILE], contents["config.json"]
    problem = _marker_problem(marker)
    if problem is not None:
        return f"malformed {MARKER_FILE}: {problem}"
    named = _CANDIDATE.fullmatch(checkpoint.name)
    if named is not None and int(named["step"]) != marker["global_step"]:
        return f"{MARKER_FILE} is for step {marker['global_step']}, the folder for step {named['step']}"
    problem = _unrecorded_files(checkpoint, marker["files"])
    if problem is not None:
        return problem
    for name, record in marker["files"].items():
        path = checkpoint / name
        if not path.is_file() or path.stat().st_size != record["size"]:
            return f"{name} is missing or has changed since the save completed (size differs)"
        if path.stat().st_mtime_ns != record["mtime_ns"]:
            return f"{name} has changed since the save completed (written since, or copied without its time)"
    if not isinstance(config, dict):
        return f"config.json must hold a JSON object, got {type(config).__name__}"
    if "num_heads" not in marker:
        return None
    if "num_heads" not in config:
        return "config.json has no `num_heads`"
    if config["num_heads"] != marker["num_heads"]:
        return f"config.json has num_heads {config['num_heads']}, the marker {marker['num_heads']}"
    return None


def read_marker(checkpoint: str | os.PathLike) -> dict:
    """The completion marker of a checkpoint that `checkpoint_problem` accepted."""
    return _read_json(Path(checkpoint) / MARKER_FILE)


def latest_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The newest `checkpoint-<step>` (or kept copy) in `output_dir` that `checkpoint_problem` accepts, or
    None; every checkpoint skipped on the way is logged with its reason."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise ValueError(f"`output_dir` {str(output_dir)!r} is not a directory")
    candidates = []
    for path in output_dir.iterdir():
        named = _CANDIDATE.fullmatch(path.name)
        if named is not None and path.is_dir():
            candidates.append((int(named["step"]), named["kept"] is None, path))
    for _, _, path in sorted(candidates, reverse=True):
        problem = checkpoint_problem(path)
        if problem is None:
            return str(path)
        logger.warning(f"skipping incomplete checkpoint {path}: {problem}")
    return None


def hide_incomplete_checkpoints(output_dir: str | os.PathLike) -> str | None:
    """Make the newest complete checkpoint of `output_dir` the one transformers' `get_last_checkpoint` (hence
    `trainer.train(resume_from_checkpoint=True)`) takes: every `checkpoint-<step>` not older than it that
    fails the check is renamed `.incomplete-checkpoint-<step>` (replacing an earlier one of that name), and a
    kept copy that is the newest complete checkpoint is linked back as `checkpoint-<step>`. Returns that
    `checkpoint-<step>`; a folder without a complete checkpoint (none saved with the marker) is left as it is
    (None)."""
    output_dir = Path(output_dir)
    latest = latest_complete_checkpoint(output_dir)  # logs why each newer one is incomplete
    if latest is None:
        return None
    latest = Path(latest)
    latest_step = int(_CANDIDATE.fullmatch(latest.name)["step"])
    resumable = output_dir / f"{PREFIX_CHECKPOINT_DIR}-{latest_step}"
    for path in sorted(output_dir.iterdir()):
        named = _CANDIDATE.fullmatch(path.name)
        if named is None or named["kept"] is not None or not path.is_dir() or path == latest:
            continue
        if int(named["step"]) >= latest_step:  # newer than the newest complete one, hence incomplete
            hidden = path.with_name(INCOMPLETE_PREFIX + path.name)
            shutil.rmtree(hidden, ignore_errors=True)
            path.rename(hidden)
            logger.warning(
                f"moved the incomplete checkpoint {path} to {hidden}: `resume_from_checkpoint=True` resumes "
                f"from {resumable}"
            )
    if not resumable.exists():  # the newest complete one is a kept copy: link it back under its name
        staging = staging_folder(resumable)
        shutil.copytree(latest, staging, copy_function=link_or_copy, dirs_exist_ok=True)
        staging.rename(resumable)
    return str(resumable)


def keep_complete_copy(checkpoint: Path) -> None:
    """Replace the kept copies in `checkpoint`'s folder by a hard-linked copy of the complete `checkpoint`
    (older copies go once it is whole; a copy cut short lacks files and fails `checkpoint_problem`)."""
    kept = checkpoint.with_name(KEPT_PREFIX + checkpoint.name)
    shutil.rmtree(kept, ignore_errors=True)
    shutil.copytree(checkpoint, kept, copy_function=link_or_copy)
    drop_kept_copies(checkpoint.parent, keep=kept)


def drop_kept_copies(output_dir: Path, keep: Path | None = None) -> None:
    for path in output_dir.glob(f"{KEPT_PREFIX}{PREFIX_CHECKPOINT_DIR}-*"):
        if path != keep and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


class CompleteCheckpointsCallback(TrainerCallback):
    """Trainer checkpoints that `trainer.train(resume_from_checkpoint=True)` can trust, for any model (module
    docstring): each `checkpoint-<step>` is marked complete once written (`on_save`), and when the Trainer is
    built (`on_init_end`, before any `train()`) checkpoints newer than the newest complete one are renamed
    `.incomplete-checkpoint-<step>`, so the stock resume takes the newest complete one. `IncrtGrowthCallback`
    does the same for a growing DDCL-INCRT run: pass one of the two."""

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        # the main process renames while the others wait, so that every process resumes the same checkpoint
        with args.main_process_first(local=args.save_on_each_node, desc="hiding incomplete checkpoints"):
            if args.should_save and Path(args.output_dir).is_dir():
                hide_incomplete_checkpoints(args.output_dir)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        """The Trainer has written checkpoint-N completely: mark it; with `save_total_limit=1` keep a copy of
        it until the next one is complete."""
        checkpoint = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if not args.should_save or not checkpoint.is_dir():
            return
        num_heads = getattr(getattr(kwargs.get("model"), "config", None), "num_heads", None)
        write_marker(checkpoint, state.global_step, num_heads if isinstance(num_heads, list) else None)
        if args.save_total_limit == 1:
            keep_complete_copy(checkpoint)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        output_dir = Path(args.output_dir)
        if args.should_save and output_dir.is_dir():
            drop_kept_copies(output_dir)  # every checkpoint the Trainer kept is marked complete by now


__all__ = [
    "INCOMPLETE_PREFIX",
    "KEPT_PREFIX",
    "MARKER_FILE",
    "CompleteCheckpointsCallback",
    "checkpoint_problem",
    "drop_kept_copies",
    "hide_incomplete_checkpoints",
    "keep_complete_copy",
    "latest_complete_checkpoint",
    "read_marker",
    "write_json_atomically",
    "write_marker",
]

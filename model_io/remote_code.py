"""Remote code on every save (docs/reliability.md, 'Hub code'): `save_pretrained` (hence `push_to_hub` and
every Trainer checkpoint) of a geoformers model copies the source of its modeling and configuration modules,
and of every geoformers module they import, into the folder as flat files, and writes the matching `auto_map`
into config.json, so the folder loads with `AutoModel*.from_pretrained(folder, trust_remote_code=True)` where
geoformers is not installed.

transformers' remote-code loader follows relative imports between the files of one folder, so each module is
copied as it is, except its top-level geoformers import lines: `from geoformers.models.<module> import
<names>` at the start of a line becomes `from .<flat name> import <names>` (`flat_name`). An indented
geoformers import (in a `try` block) is what the model's forward does not need, such as the saving and
loading of `io_mixin`: it is not shipped, and in a copy its `except ImportError` branch runs. Modules
imported by name at run time (the Triton kernels) are not shipped either: in a copy they do not import and
the PyTorch path runs. A copy loaded as remote code re-saves through transformers' own
`custom_object_save`, its files being flat already.
"""

import importlib.util
import os
import re
from pathlib import Path

PACKAGE = "geoformers"
MODELS = f"{PACKAGE}.models"
MODEL_HOMES = (
    "ddl_mhc",
    "ddcl_incrt",
)  # geoformers.models.<home>: one model's configuration, modeling and ops

# Auto class names written into `auto_map`, keyed by the model class' role.
TASK_AUTO_CLASSES = {
    "ForCausalLM": "AutoModelForCausalLM",
    "ForSequenceClassification": "AutoModelForSequenceClassification",
}

_SHIPPED_IMPORT = re.compile(rf"from {PACKAGE}\.(?P<module>[\w.]+) import ")
_UNSHIPPABLE_IMPORT = re.compile(rf"\s*(import {PACKAGE}\b|from {PACKAGE} import )")


def is_internal(module_name: str) -> bool:
    """Whether `module_name` is geoformers or one of its modules."""
    return module_name == PACKAGE or module_name.startswith(PACKAGE + ".")


def flat_name(module_name: str) -> str:
    """The file stem a geoformers module ships as: its path below `geoformers.models`, without the model's
    home, dots made underscores (`geoformers.models.ddl_mhc.modeling_ddl_mhc` -> `modeling_ddl_mhc`,
    `geoformers.models.ddl_mhc.ops.charts.naive` -> `ops_charts_naive`, `geoformers.models.input_checks` ->
    `input_checks`)."""
    if not module_name.startswith(MODELS + "."):
        raise ValueError(f"{module_name!r} is not a module of {MODELS}; only the models' code ships")
    parts = module_name.removeprefix(MODELS + ".").split(".")
    if len(parts) > 1 and parts[0] in MODEL_HOMES:
        parts = parts[1:]
    return "_".join(parts)


def source_file(module_name: str) -> str:
    """The path of `module_name`'s source file (a package's `__init__.py`)."""
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        raise ValueError(f"cannot find the source of module {module_name!r}")
    return spec.origin


def shipped_source(module_name: str) -> tuple[str, tuple[str, ...]]:
    """The source of `module_name` with its top-level geoformers import lines made relative, and the
    geoformers modules they import. ValueError names the line of an `import geoformers...` or
    `from geoformers import ...`, which cannot be shipped."""
    origin = source_file(module_name)
    lines = Path(origin).read_text(encoding="utf-8").splitlines(keepends=True)
    imported = []
    for number, line in enumerate(lines, 1):
        if _UNSHIPPABLE_IMPORT.match(line):
            raise ValueError(
                f"{origin}:{number}: only `from {PACKAGE}.<module> import <names>` can be shipped as "
                "remote code"
            )
        match = _SHIPPED_IMPORT.match(line)
        if match is not None:
            module = f"{PACKAGE}.{match['module']}"
            lines[number - 1] = f"from .{flat_name(module)} import {line[match.end() :]}"
            imported.append(module)
    return "".join(lines), tuple(imported)


def remote_code_files(*module_names: str) -> dict[str, str]:
    """File name -> shipped source of `module_names` and every geoformers module they import, transitively."""
    files: dict[str, tuple[str, str]] = {}
    pending = list(module_names)
    while pending:
        name = pending.pop()
        file_name = f"{flat_name(name)}.py"
        if file_name in files:
            if files[file_name][0] != name:
                raise ValueError(f"{files[file_name][0]} and {name} would both be shipped as {file_name}")
            continue
        source, imported = shipped_source(name)
        files[file_name] = (name, source)
        pending.extend(imported)
    return {file_name: source for file_name, (_, source) in sorted(files.items())}


def write_remote_code(model, folder: str | os.PathLike) -> dict[str, str]:
    """Write the code files of a geoformers `model` into `folder`; return the `auto_map` that points the Auto
    classes at them (AutoConfig, AutoModel and the model's task class)."""
    config = getattr(model, "config", None)
    if not is_internal(type(model).__module__) or not is_internal(type(config).__module__):
        raise TypeError(f"expected a geoformers model, got {type(model).__name__}")
    config_module, model_module = type(config).__module__, type(model).__module__
    for file_name, source in remote_code_files(model_module, config_module).items():
        (Path(folder) / file_name).write_text(source, encoding="utf-8")
    base_class = type(getattr(model, "base_model", model))
    auto_map = {
        "AutoConfig": f"{flat_name(config_module)}.{type(config).__name__}",
        "AutoModel": f"{flat_name(base_class.__module__)}.{base_class.__name__}",
    }
    for suffix, auto_class in TASK_AUTO_CLASSES.items():
        if type(model).__name__.endswith(suffix):
            auto_map[auto_class] = f"{flat_name(model_module)}.{type(model).__name__}"
    return auto_map


__all__ = ["TASK_AUTO_CLASSES", "flat_name", "is_internal", "remote_code_files", "write_remote_code"]

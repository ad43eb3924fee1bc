"""Remote code on every save (docs/reliability.md, 'Hub code'): `save_pretrained` (hence `push_to_hub` and
every Trainer checkpoint) of a geoformers model copies the source of its modeling and configuration modules,
and of every geoformers module they import, into the folder as flat files, and writes the matching `auto_map`
into config.json, so the folder loads with `AutoModel*.from_pretrained(folder, trust_remote_code=True)` where
geoformers is not installed.

transformers' remote-code loader follows relative imports between the files of one folder, so each module is
copied as it is, except its import lines: `from geoformers.<a>.<b> import <names>` becomes
`from .<a>_<b> import <names>` (`flat_name`), and the supported transformers range (`transformers_range`) is
imported before any other import, so a transformers outside it fails with its message (docs/versions.md,
'Saved folders'). Any other form of geoformers import is an error at save time.
Modules imported by name at run time (the Triton kernels, `ops.dispatch.kernels`) are not shipped: in a
copy they do not import and the PyTorch path runs. A copy loaded as remote code re-saves through
transformers' own `custom_object_save`, its files being flat already.
"""

import ast
import functools
import importlib.util
import inspect
import os
import re
from pathlib import Path

from huggingface_hub import constants
from huggingface_hub.errors import HfHubHTTPError, HTTPError
from transformers import PreTrainedModel

PACKAGE = "geoformers"

# Auto class names written into `auto_map`, keyed by the model class' role.
TASK_AUTO_CLASSES = {
    "ForCausalLM": "AutoModelForCausalLM",
    "ForSequenceClassification": "AutoModelForSequenceClassification",
}

_IMPORT_LINE = re.compile(rf"^(?P<indent>\s*)from {PACKAGE}\.(?P<module>[\w.]+) import ")
_SAVE_SIGNATURE = inspect.signature(PreTrainedModel.save_pretrained)


def _is_internal(module_name: str) -> bool:
    return module_name == PACKAGE or module_name.startswith(PACKAGE + ".")


def flat_name(module_name: str) -> str:
    """The file stem a geoformers module ships as: `geoformers.modeling.ddl_mhc` -> `modeling_ddl_mhc`."""
    if not module_name.startswith(PACKAGE + "."):
        raise ValueError(f"{module_name!r} is not a module of the {PACKAGE} package")
    return module_name.removeprefix(PACKAGE + ".").replace(".", "_")


# The supported transformers range, checked on import (docs/versions.md): every shipped file imports it first.
RANGE_MODULE = f"{PACKAGE}.modeling.transformers_range"
_RANGE_IMPORT = f"from .{flat_name(RANGE_MODULE)} import TRANSFORMERS_REQUIREMENT  # noqa: F401\n"


def _spec(module_name: str):
    try:
        return importlib.util.find_spec(module_name)
    except ModuleNotFoundError:  # a parent that is not a package
        return None


def shipped_source(module_name: str) -> tuple[str, tuple[str, ...]]:
    """The source of `module_name` with its geoformers import lines made relative, and the geoformers modules
    it imports. ValueError names the line of any geoformers import that is not `from geoformers.<module>
    import <names>` at the start of its line, with <names> that are not modules."""
    spec = _spec(module_name)
    if spec is None or spec.origin is None:
        raise ValueError(f"cannot find the source of module {module_name!r}")
    stat = os.stat(spec.origin)
    return _rewritten(spec.origin, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _rewritten(origin: str, mtime_ns: int, size: int) -> tuple[str, tuple[str, ...]]:
    """`shipped_source` of one version of a file (parsed once per process while the file is unchanged)."""
    source = Path(origin).read_text(encoding="utf-8")
    lines = source.splitlines(keepends=True)
    imported = []
    tree = ast.parse(source, origin)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(_is_internal(alias.name) for alias in node.names):
            where = f"{origin}:{node.lineno}"
            raise ValueError(
                f"{where}: `import {PACKAGE}...` cannot be shipped; write `from "
                f"{PACKAGE}.<module> import <name>`"
            )
        if not isinstance(node, ast.ImportFrom) or not (node.level or _is_internal(node.module or "")):
            continue
        where = f"{origin}:{node.lineno}"
        match = _IMPORT_LINE.match(lines[node.lineno - 1])
        if node.level or match is None or f"{PACKAGE}.{match['module']}" != node.module:
            raise ValueError(
                f"{where}: only `from {PACKAGE}.<module> import <names>` at the start of a line "
                "can be shipped as remote code"
            )
        submodules = [alias.name for alias in node.names if _spec(f"{node.module}.{alias.name}") is not None]
        if submodules:
            raise ValueError(f"{where}: imports the module {node.module}.{submodules[0]}; import its names")
        rest = lines[node.lineno - 1][match.end() :]
        lines[node.lineno - 1] = f"{match['indent']}from .{flat_name(node.module)} import {rest}"
        imported.append(node.module)
    if Path(origin) != Path(_spec(RANGE_MODULE).origin):
        imports = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
        first = next((node for node in imports if getattr(node, "module", None) != "__future__"), None)
        if first is not None:  # the range check runs before any other import
            lines.insert(first.lineno - 1, _RANGE_IMPORT)
            imported.append(RANGE_MODULE)
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
    if not _is_internal(type(model).__module__) or not _is_internal(type(config).__module__):
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


class HubCodeMixin:
    """`save_pretrained` that writes the model's code files beside the weights and their `auto_map` into the
    config (module docstring). `register_for_auto_class` on a geoformers model class changes nothing (its
    code ships anyway); a registered geoformers config is refused, as transformers would copy its nested
    source file instead."""

    @classmethod
    def is_remote_code(cls) -> bool:
        return super().is_remote_code() and not _is_internal(cls.__module__)

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs):
        arguments = _SAVE_SIGNATURE.bind(self, save_directory, *args, **kwargs).arguments
        if _is_internal(type(self).__module__) and self.should_save_on_this_rank(
            arguments.get("is_main_process", True)
        ):
            if type(self.config).is_remote_code():
                raise ValueError(
                    f"{type(self.config).__name__} is registered for an auto class: "
                    "transformers would ship its nested source (register_for_auto_class), which does not "
                    "import on its own; geoformers configs need none, save_pretrained ships the code"
                )
            os.makedirs(save_directory, exist_ok=True)
            self.config.auto_map = write_remote_code(self, save_directory)
        return super().save_pretrained(save_directory, *args, **kwargs)

    def push_to_hub(self, *args, **kwargs):
        """transformers' `push_to_hub`; a Hub that cannot be reached (no network, offline mode) raises a
        ConnectionError that names what the upload needs and the offline route (`export_for_hub`)."""
        try:
            return super().push_to_hub(*args, **kwargs)
        except (ConnectionError, HTTPError) as error:
            if isinstance(error, HfHubHTTPError):  # the Hub answered (e.g. 401): its own message says why
                raise
            raise ConnectionError(
                f"push_to_hub could not reach the Hub at {constants.ENDPOINT} "
                f"({type(error).__name__}: {error}). Uploading needs a network connection and a write token "
                "(`hf auth login` or HF_TOKEN). Offline, geoformers.export_for_hub(model, tokenizer, folder) "
                "writes the same folder (weights, code, tokenizer, model card); upload it later with "
                "huggingface_hub.upload_folder."
            ) from error

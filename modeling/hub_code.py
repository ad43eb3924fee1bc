"""Remote code on every save: `save_pretrained` (hence `push_to_hub` and every Trainer checkpoint) of a
geoformers model writes flat, self-contained `configuration_<type>.py` / `modeling_<type>.py` next to the
weights and the matching `auto_map` into config.json, so the folder loads with
`AutoModel*.from_pretrained(folder, trust_remote_code=True)` where geoformers is not installed.

transformers' own mechanism (`register_for_auto_class`, then `custom_object_save` on save) copies only a
model's file and its same-folder relative imports, so the nested package layout cannot be shipped as is.
`flatten_module` inlines every module of this package that a source module imports (dependencies first, the
way transformers generates `modeling_*.py` from `modular_*.py`). A flat copy loaded as remote code is
registered by transformers' Auto classes and re-saves through `custom_object_save`, its files being flat.
"""

import ast
import importlib.util
import inspect
import os
from pathlib import Path

from huggingface_hub import HfApi
from transformers import PreTrainedModel

PACKAGE = "geoformers"

# Auto class names written into `auto_map`, keyed by the model class' role.
TASK_AUTO_CLASSES = {
    "ForCausalLM": "AutoModelForCausalLM",
    "ForSequenceClassification": "AutoModelForSequenceClassification",
}


def _module_source(module_name: str) -> tuple[Path, str]:
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        raise ValueError(f"cannot find the source of module {module_name!r}")
    path = Path(spec.origin)
    return path, path.read_text(encoding="utf-8")


def _resolve(module_name: str, node: ast.ImportFrom) -> str:
    """Absolute module name of a `from X import ...` statement found in `module_name`."""
    if node.level == 0:
        return node.module or ""
    is_package = module_name == PACKAGE or _module_source(module_name)[0].name == "__init__.py"
    parts = module_name.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_internal(name: str) -> bool:
    return name == PACKAGE or name.startswith(PACKAGE + ".")


def _statement_source(lines: list[str], node: ast.stmt) -> str:
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "".join(lines[start - 1 : node.end_lineno])


def flatten_module(module_name: str, keep_imports: dict[str, str] | None = None) -> str:
    """Source of `module_name` with every `geoformers` module it imports inlined before it.

    `keep_imports` maps an internal module to the relative module that replaces it in the
    flat file (e.g. the configuration module -> ".configuration_ddl_mhc") instead of inlining.
    """
    keep_imports = keep_imports or {}
    external: list[str] = []
    bodies: list[str] = []
    defined: dict[str, str] = {}
    done: set[str] = set()
    future: set[str] = set()

    def visit(name: str) -> None:
        if name in done:
            return
        done.add(name)
        path, source = _module_source(name)
        tree = ast.parse(source)
        lines = source.splitlines(keepends=True)
        for node in ast.walk(tree):
            nested = isinstance(node, ast.ImportFrom) and (node.level > 0 or _is_internal(node.module or ""))
            if nested and node not in tree.body:
                raise ValueError(f"{path}: internal import inside a function cannot be flattened")
        aliases: list[str] = []
        for index, node in enumerate(tree.body):
            if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # module docstring
            if isinstance(node, ast.Import):
                if any(_is_internal(alias.name) for alias in node.names):
                    raise ValueError(f"{path}: use `from ... import` for internal modules")
                external.append(_statement_source(lines, node))
            elif isinstance(node, ast.ImportFrom) and node.module == "__future__":
                future.update(alias.name for alias in node.names)
            elif _defined_names(node) == ["__all__"]:
                continue  # export lists of the source modules mean nothing in the flat file
            elif isinstance(node, ast.ImportFrom) and (node.level > 0 or _is_internal(node.module or "")):
                target = _resolve(name, node)
                if target in keep_imports:
                    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
                    external.append(f"from {keep_imports[target]} import {names}\n")
                    continue
                for alias in node.names:
                    submodule = f"{target}.{alias.name}"
                    if importlib.util.find_spec(target) and _is_submodule(submodule):
                        raise ValueError(f"{path}: import names, not modules ({submodule})")
                    if alias.asname and alias.asname != alias.name:
                        aliases.append(f"{alias.asname} = {alias.name}\n")
                visit(target)
            elif isinstance(node, ast.ImportFrom):
                external.append(_statement_source(lines, node))
            else:
                for top_name in _defined_names(node):
                    if top_name in defined and defined[top_name] != name:
                        raise ValueError(
                            f"name {top_name!r} is defined in both {defined[top_name]} and {name}; "
                            "rename one so the flat file stays unambiguous"
                        )
                    defined[top_name] = name
                bodies.append(_statement_source(lines, node))
        if aliases:
            bodies.append("".join(aliases))
        bodies.append("\n")

    visit(module_name)
    header = f'"""Generated from `{module_name}` by geoformers\' hub export; do not edit by hand."""\n\n'
    if future:
        header += f"from __future__ import {', '.join(sorted(future))}\n\n"
    unique_external = list(dict.fromkeys(external))
    return header + "".join(unique_external) + "\n\n" + "\n".join(bodies).rstrip() + "\n"


def _is_submodule(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _defined_names(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def write_remote_code(model, folder: str | os.PathLike) -> dict[str, str]:
    """Write the flat configuration and modeling files of a geoformers `model` into `folder`; return the
    `auto_map` that points the Auto classes at them (AutoConfig, AutoModel and the model's task class)."""
    config = getattr(model, "config", None)
    if not _is_internal(type(model).__module__) or not _is_internal(type(config).__module__):
        raise TypeError(f"expected a geoformers model, got {type(model).__name__}")
    model_type = config.model_type
    config_file, modeling_file = f"configuration_{model_type}", f"modeling_{model_type}"
    config_module = type(config).__module__
    folder = Path(folder)
    (folder / f"{config_file}.py").write_text(flatten_module(config_module), encoding="utf-8")
    modeling_source = flatten_module(type(model).__module__, {config_module: f".{config_file}"})
    (folder / f"{modeling_file}.py").write_text(modeling_source, encoding="utf-8")
    auto_map = {"AutoConfig": f"{config_file}.{type(config).__name__}"}
    base_class = type(getattr(model, "base_model", model))
    auto_map["AutoModel"] = f"{modeling_file}.{base_class.__name__}"
    for suffix, auto_class in TASK_AUTO_CLASSES.items():
        if type(model).__name__.endswith(suffix):
            auto_map[auto_class] = f"{modeling_file}.{type(model).__name__}"
    return auto_map


_SAVE_SIGNATURE = inspect.signature(PreTrainedModel.save_pretrained)


class HubCodeMixin:
    """`save_pretrained` that ships the model's code: the flat files of `write_remote_code` beside the
    weights and their `auto_map` in the config (kept on the live config, as `custom_object_save` does).
    `register_for_auto_class` on a geoformers class or config changes nothing: transformers' copy of the
    nested package files would not import, so `custom_object_save` is not used for them."""

    @classmethod
    def is_remote_code(cls) -> bool:
        return super().is_remote_code() and not _is_internal(cls.__module__)

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs):
        if not _is_internal(type(self).__module__):  # a flat copy loaded as remote code
            return super().save_pretrained(save_directory, *args, **kwargs)
        bound = _SAVE_SIGNATURE.bind(self, save_directory, *args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        arguments.pop("self")
        hub_kwargs, push = arguments.pop("kwargs"), arguments.pop("push_to_hub")
        writes = self.should_save_on_this_rank(arguments["is_main_process"])
        config = self.config
        if writes:
            os.makedirs(save_directory, exist_ok=True)
            timestamps = self._get_files_timestamps(save_directory)
            config.auto_map = write_remote_code(self, save_directory)
        config._auto_class = None  # shadows a registered config class for this save (see the class doc)
        try:
            super().save_pretrained(**arguments)
        finally:
            del config._auto_class
        if push and writes:
            # as transformers' `save_pretrained(push_to_hub=True)`, after the code files are written
            token = arguments["token"]
            commit_message = hub_kwargs.pop("commit_message", None)
            create_pr = hub_kwargs.pop("create_pr", False)
            repo_id = hub_kwargs.pop("repo_id", Path(save_directory).name)
            repo_id = HfApi().create_repo(repo_id, exist_ok=True, token=token, **hub_kwargs).repo_id
            return self._upload_modified_files(save_directory, repo_id, timestamps, token=token,
                                               commit_message=commit_message, create_pr=create_pr)
        return None

"""Hub export: flat, self-contained code files that load with `trust_remote_code=True` (DESIGN §4).

transformers copies only a model's own file and its same-folder imports when it saves custom
code, so the nested package layout cannot be shipped as is. `flatten_module` inlines every
module of this package that a source module imports (dependencies first, the way transformers
generates `modeling_*.py` from `modular_*.py`) and `export_for_hub` writes
`configuration_<type>.py` / `modeling_<type>.py`, the `auto_map`, the weights, the tokenizer and
the model card into one folder that loads on a machine without `geoformers`.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from .atomic_save import replace_folder, staging_folder

PACKAGE = "geoformers"
MODEL_CARDS = Path(__file__).resolve().parents[1] / "model_cards"

# Auto class names written into `auto_map`, keyed by the model class' role.
_TASK_AUTO_CLASS = {
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


def export_for_hub(model, tokenizer, folder: str | os.PathLike) -> Path:
    """Write `model` (+ `tokenizer`, may be None) as a folder that loads with `trust_remote_code=True`.

    The folder is built in a temporary sibling and swapped into place only when complete
    (`atomic_save.replace_folder`): an interrupted export leaves the previous folder as it was.
    """
    config = getattr(model, "config", None)
    if not _is_internal(type(model).__module__) or not _is_internal(type(config).__module__):
        raise TypeError(f"export_for_hub expects a geoformers model, got {type(model).__name__}")
    model_type = config.model_type
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    config_file, modeling_file = f"configuration_{model_type}", f"modeling_{model_type}"
    staging = staging_folder(folder)
    try:
        config_module = type(config).__module__
        (staging / f"{config_file}.py").write_text(flatten_module(config_module), encoding="utf-8")
        modeling_source = flatten_module(type(model).__module__, {config_module: f".{config_file}"})
        (staging / f"{modeling_file}.py").write_text(modeling_source, encoding="utf-8")

        auto_map = {"AutoConfig": f"{config_file}.{type(config).__name__}"}
        base_class = getattr(model, "base_model", model)
        auto_map["AutoModel"] = f"{modeling_file}.{type(base_class).__name__}"
        for suffix, auto_class in _TASK_AUTO_CLASS.items():
            if type(model).__name__.endswith(suffix):
                auto_map[auto_class] = f"{modeling_file}.{type(model).__name__}"
        previous = getattr(config, "auto_map", None)
        config.auto_map = auto_map
        try:
            model.save_pretrained(staging)
        finally:
            config.auto_map = previous
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        card = MODEL_CARDS / f"{model_type}.md"
        if card.is_file():
            shutil.copyfile(card, staging / "README.md")
        replace_folder(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder


def push_to_hub(model, repo_id: str, tokenizer=None, *, private: bool | None = None, token=None,
                commit_message: str = "Upload geoformers model") -> str:
    """Export with `export_for_hub` and upload the folder to the Hub; returns the commit URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    with tempfile.TemporaryDirectory() as workdir:
        folder = export_for_hub(model, tokenizer, Path(workdir) / "export")
        info = api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=commit_message)
    return str(info)

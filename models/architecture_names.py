"""The package's architectures named in the `transformers` namespace (docs/serving.md, 'How the server finds
the model'). `transformers serve` loads a model as `getattr(transformers, config.architectures[0])
.from_pretrained(...)`, which finds in-tree classes only; a remote-code model dies there with "module
transformers has no attribute ...". The server imports a folder's configuration module (trust_remote_code)
before that lookup, so the configuration modules name their architectures here: the named class loads
through the Auto class of the architecture's task, which finds the model in the folder's `auto_map`; an
architecture that does not generate text names a class whose `from_pretrained` says so instead.

transformers re-executes its own `__init__` when some of its modules are first imported
(`direct_transformers_import`), so a module imported before that (the server's among them) holds an older
`transformers` module object than `sys.modules`: the names go into every one of them."""

import sys
from types import ModuleType


def _transformers_namespaces() -> list[ModuleType]:
    """`sys.modules["transformers"]` and every other `transformers` module object a loaded module holds
    (read from the modules' `__dict__`, which triggers no lazy import)."""
    current = sys.modules["transformers"]
    found = {id(current): current}
    for module in list(sys.modules.values()):
        held = getattr(module, "__dict__", {}).get("transformers")
        if isinstance(held, ModuleType) and held.__name__ == "transformers":
            found.setdefault(id(held), held)
    return list(found.values())


def _name(name: str, from_pretrained) -> None:
    """`transformers.<name>`: a class whose `from_pretrained` is `from_pretrained`, in every namespace."""
    cls = type(name, (), {"__module__": __name__, "from_pretrained": classmethod(from_pretrained)})
    for namespace in _transformers_namespaces():
        if name not in vars(namespace):  # an in-tree class, or this module imported twice
            setattr(namespace, name, cls)


def name_architecture(name: str, auto_class: type) -> None:
    """`transformers.<name>`: a class whose `from_pretrained` is `auto_class.from_pretrained` (e.g.
    `AutoModelForCausalLM`, which finds the class in the folder's `auto_map`)."""

    def from_pretrained(cls, *args, **kwargs):
        return auto_class.from_pretrained(*args, **kwargs)

    _name(name, from_pretrained)


def name_non_generator(name: str, auto_class_name: str) -> None:
    """`transformers.<name>` for an architecture that generates no text: loading it by name (what
    `transformers serve` does) is a `ValueError` that says how to load it and that it cannot be served."""

    def from_pretrained(cls, *args, **kwargs):
        raise ValueError(
            f"{name} is an encoder: it classifies and generates no text, so `transformers serve` and "
            f"text-generation pipelines cannot run it; load it with `transformers.{auto_class_name}"
            ".from_pretrained(folder, trust_remote_code=True)` or serve a DDL-mHC causal LM"
        )

    _name(name, from_pretrained)

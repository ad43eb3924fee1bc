"""The transformers internals the installed package imports (docs/versions.md, 'Internal imports'), each with
the signature the models were written against: a transformers release that moves, renames or re-signs one
fails here, naming what changed, instead of deep inside a model. 'Internal' is anything imported from a
transformers submodule that is not the same object at the top level of `transformers`."""

import ast
import dataclasses
import importlib
import importlib.util
import inspect
from pathlib import Path

import transformers

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_FILES = [ROOT / "__init__.py"] + sorted(
    path
    for folder in ("models", "model_io", "tokenization", "training")
    for path in (ROOT / folder).rglob("*.py")
)

# (module, name) -> what the package relies on (`describe`); the same for every supported release
INTERNALS = {
    ("transformers", "initialization"): {
        "attributes": {
            "constant_": {"parameters": ["tensor", "val"]},
            "copy_": {"parameters": ["tensor", "other"]},
            "normal_": {"parameters": ["tensor", "mean", "std", "generator"]},
            "zeros_": {"parameters": ["tensor"]},
        }
    },
    ("transformers.cache_utils", "LinearAttentionCacheLayerMixin"): {
        "init": ["self", "number_of_states", "**kwargs"],
        "methods": [
            "activate_past_recording",
            "crop",
            "get_max_length",
            "lazy_initialization",
            "offload",
            "prefetch",
            "reorder_cache",
            "reset",
            "update_conv_state",
            "update_recurrent_state",
        ],
    },
    ("transformers.conversion_mapping", "get_checkpoint_conversion_mapping"): {"parameters": ["model_type"]},
    ("transformers.conversion_mapping", "register_checkpoint_conversion_mapping"): {
        "parameters": ["model_type_or_class_name", "mapping", "overwrite"]
    },
    ("transformers.loss.loss_utils", "ForCausalLMLoss"): {
        "parameters": [
            "logits",
            "labels",
            "vocab_size",
            "num_items_in_batch",
            "ignore_index",
            "shift_labels",
            "**kwargs",
        ]
    },
    # the forward accepts continuous batching's paged cache (isinstance, and its `update` through attention)
    ("transformers.generation.continuous_batching", "PagedAttentionCache"): {"methods": ["update"]},
    ("transformers.integrations.integration_utils", "INTEGRATION_TO_CALLBACK"): {"type": "dict"},
    ("transformers.integrations.integration_utils", "get_reporting_integration_callbacks"): {
        "parameters": ["report_to"]
    },
    ("transformers.masking_utils", "create_bidirectional_mask"): {
        "parameters": [
            "config",
            "inputs_embeds",
            "attention_mask",
            "encoder_hidden_states",
            "cache",
            "or_mask_function",
            "and_mask_function",
            "allow_is_bidirectional_skip",
            "**kwargs",
        ]
    },
    ("transformers.masking_utils", "create_causal_mask"): {
        "parameters": [
            "config",
            "inputs_embeds",
            "attention_mask",
            "cache",
            "position_ids",
            "or_mask_function",
            "and_mask_function",
            "block_sequence_ids",
            "layer_idx",
            "allow_is_causal_skip",
        ]
    },
    ("transformers.masking_utils", "create_recurrent_attention_mask"): {
        "parameters": ["config", "inputs_embeds", "attention_mask", "cache", "**kwargs"]
    },
    ("transformers.modeling_outputs", "BaseModelOutputWithPast"): {
        "fields": ["last_hidden_state", "cache", "hidden_states", "attentions"],
        "methods": ["get", "pop", "setdefault", "to_tuple", "update"],
    },
    ("transformers.modeling_outputs", "CausalLMOutputWithPast"): {
        "fields": ["loss", "logits", "cache", "hidden_states", "attentions"],
        "methods": ["get", "pop", "setdefault", "to_tuple", "update"],
    },
    ("transformers.modeling_utils", "ALL_ATTENTION_FUNCTIONS"): {"type": "AttentionInterface"},
    ("transformers.modeling_utils", "slice_logits_to_keep"): {
        "parameters": ["hidden_states", "logits_to_keep"]
    },
    ("transformers.models.bert.modeling_bert", "BertEncoder"): {
        "init": ["self", "config"],
        "forward": [
            "self",
            "hidden_states",
            "attention_mask",
            "encoder_hidden_states",
            "encoder_attention_mask",
            "cache",
            "use_cache",
            "**kwargs",
        ],
        "methods": ["forward"],
    },
    ("transformers.models.llama.modeling_llama", "LlamaAttention"): {
        "init": ["self"],
        "forward": ["self", "hidden_states", "position_embeddings", "attention_mask", "cache", "**kwargs"],
        "methods": ["forward"],
    },
    ("transformers.models.llama.modeling_llama", "LlamaMLP"): {
        "init": ["self", "config"],
        "forward": ["self", "x"],
        "methods": ["forward"],
    },
    ("transformers.models.llama.modeling_llama", "LlamaRMSNorm"): {
        "init": ["self", "hidden_size", "eps"],
        "forward": ["self", "hidden_states"],
        "methods": ["extra_repr", "forward"],
    },
    ("transformers.models.llama.modeling_llama", "LlamaRotaryEmbedding"): {
        "init": ["self", "config"],
        "forward": ["self", "x", "position_ids"],
        "methods": ["compute_default_rope_parameters", "forward"],
    },
    ("transformers.processing_utils", "Unpack"): {"type": "_SpecialForm"},
    ("transformers.tokenization_utils_base", "VERY_LARGE_INTEGER"): {
        "value": 1000000000000000019884624838656
    },
    ("transformers.trainer_callback", "ExportableState"): {"methods": ["state"]},
    ("transformers.trainer_pt_utils", "get_parameter_names"): {
        "parameters": ["model", "forbidden_layer_types", "forbidden_layer_names"]
    },
    ("transformers.trainer_utils", "PREFIX_CHECKPOINT_DIR"): {"value": "checkpoint"},
    ("transformers.trainer_utils", "TrainOutput"): {"class": "TrainOutput"},
    ("transformers.utils", "ModelOutput"): {
        "init": ["self", "*args", "**kwargs"],
        "methods": ["get", "pop", "setdefault", "to_tuple", "update"],
    },
    ("transformers.utils", "TransformersKwargs"): {"init": ["self", "*args", "**kwargs"]},
    ("transformers.utils", "can_return_tuple"): {"parameters": ["func"]},
    ("transformers.utils.deprecation", "deprecate_kwarg"): {
        "parameters": [
            "old_name",
            "version",
            "new_name",
            "warn_if_greater_or_equal_version",
            "raise_if_greater_or_equal_version",
            "raise_if_both_names",
            "additional_message",
        ]
    },
    ("transformers.utils.generic", "merge_with_config_defaults"): {"parameters": ["func"]},
    ("transformers.utils.output_capturing", "OutputRecorder"): {
        "fields": [
            "target_class",
            "index",
            "layer_name",
            "class_name",
            "capture_initial_hidden_state",
            "num_hidden_layers_key",
        ]
    },
    ("transformers.utils.output_capturing", "capture_outputs"): {
        "parameters": ["func", "tie_last_hidden_states"]
    },
    ("transformers.utils.type_validators", "activation_fn_key"): {
        "parameters": [
            "default",
            "default_factory",
            "init",
            "repr",
            "hash",
            "compare",
            "metadata",
            "**kwargs",
        ]
    },
    ("transformers.utils.type_validators", "interval"): {
        "parameters": ["min", "max", "exclude_min", "exclude_max"]
    },
}


def parameters(function) -> list[str]:
    """Parameter names, `*args` / `**kwargs` marked as such."""
    prefix = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return [prefix.get(p.kind, "") + name for name, p in inspect.signature(function).parameters.items()]


def describe(obj, attributes=()) -> dict:
    """A function's parameters; a class's dataclass fields or `__init__` parameters, its `forward`'s and the
    public methods transformers defines on it; a constant's value; a module's `attributes` (the ones the
    package reads), each described."""
    if inspect.ismodule(obj):
        return {"attributes": {name: describe(getattr(obj, name, None)) for name in sorted(attributes)}}
    if inspect.isclass(obj):
        description = {}
        if dataclasses.is_dataclass(obj):
            description["fields"] = [field.name for field in dataclasses.fields(obj)]
        elif "__init__" in {k for c in obj.__mro__[:-1] for k in vars(c)}:
            description["init"] = parameters(obj.__init__)
        if callable(getattr(obj, "forward", None)):
            description["forward"] = parameters(obj.forward)
        own = {  # defined by transformers (not torch's Module, dict, ...)
            name
            for cls in obj.__mro__
            if cls.__module__.startswith("transformers")
            for name, value in vars(cls).items()
            if callable(value) and not name.startswith("_")
        }
        return {**description, "methods": sorted(own)} if own else description or {"class": obj.__name__}
    if isinstance(obj, int | str | float):
        return {"value": obj}
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return {"parameters": parameters(obj)}
    return {"type": type(obj).__name__}


def internal_object(module: str, name: str):
    """`from <module> import <name>` as Python does it: an attribute, else a submodule."""
    parent = importlib.import_module(module)
    if hasattr(parent, name):
        return getattr(parent, name)
    return importlib.import_module(f"{module}.{name}")


def internal_imports() -> dict[tuple[str, str], set[str]]:
    """(module, name) -> the attributes the package reads from it (an imported module), for every internal
    import of the package's files."""
    found = {}
    for path in PACKAGE_FILES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("transformers"):
                continue
            for alias in node.names:
                if node.module == "transformers":
                    if importlib.util.find_spec(f"transformers.{alias.name}") is None:
                        continue  # a top-level name
                elif getattr(transformers, alias.name, None) is internal_object(node.module, alias.name):
                    continue  # the same object at the top level
                local = alias.asname or alias.name
                read = {
                    attribute.attr
                    for attribute in ast.walk(tree)
                    if isinstance(attribute, ast.Attribute)
                    and isinstance(attribute.value, ast.Name)
                    and attribute.value.id == local
                }
                module_import = inspect.ismodule(internal_object(node.module, alias.name))
                found.setdefault((node.module, alias.name), set()).update(read if module_import else ())
    return found


def changes(expected: dict, now: dict, where: str) -> list[str]:
    """What `now` lacks of `expected` (`describe` results): a missing list item or key, a changed value."""
    found = []
    for key, want in expected.items():
        have = now.get(key)
        if isinstance(want, dict):
            found += changes(want, have or {}, f"{where}.{key}")
        elif isinstance(want, list):
            missing = [item for item in want if item not in (have or [])]
            if missing:
                found.append(f"{where}: {key} no longer has {missing} (now {have})")
        elif have != want:
            found.append(f"{where}: {key} was {want!r}, now {have!r}")
    return found


def current_changes(table: dict) -> list[str]:
    """Every difference between `table` and the installed transformers."""
    found = []
    for (module, name), expected in table.items():
        where = f"{module}.{name}"
        try:
            obj = internal_object(module, name)
        except ImportError:
            found.append(f"{where}: no longer exists")
            continue
        found += changes(expected, describe(obj, expected.get("attributes", ())), where)
    return found


def test_every_internal_import_of_the_package_is_listed():
    found, listed = set(internal_imports()), set(INTERNALS)
    assert found == listed, (
        f"imported but not listed: {sorted(found - listed)}; listed but no longer imported: "
        f"{sorted(listed - found)}. Update INTERNALS (`python tests/test_transformers_internals.py` prints "
        "the installed release's entries) and docs/versions.md, 'Internal imports'"
    )
    for (module, name), attributes in internal_imports().items():
        assert attributes <= set(INTERNALS[(module, name)].get("attributes", ())), (module, name)


def test_the_internals_have_the_signatures_the_models_were_written_against():
    found = current_changes(INTERNALS)
    assert not found, (
        f"transformers {transformers.__version__} differs from the supported releases in {len(found)} "
        "internal(s) geoformers imports (docs/versions.md, 'Checking a transformers release'):\n"
        + "\n".join(found)
    )


def test_the_check_names_a_real_past_change():
    """transformers 5.24 renamed the outputs' `past_key_values` to `cache`: the table as of 5.23 is reported
    with the field that went and the fields there are now; a removed name is reported as gone."""
    as_of_5_23 = {
        ("transformers.modeling_outputs", "BaseModelOutputWithPast"): {
            "fields": ["last_hidden_state", "past_key_values", "hidden_states", "attentions"]
        },
        ("transformers.modeling_utils", "no_such_helper"): {"parameters": ["x"]},
    }
    assert current_changes(as_of_5_23) == [
        "transformers.modeling_outputs.BaseModelOutputWithPast: fields no longer has ['past_key_values'] "
        "(now ['last_hidden_state', 'cache', 'hidden_states', 'attentions'])",
        "transformers.modeling_utils.no_such_helper: no longer exists",
    ]


if __name__ == "__main__":  # the installed release's entries, to paste into INTERNALS after a checked bump
    for (module, name), attributes in sorted(internal_imports().items()):
        print(f"    {(module, name)!r}: {describe(internal_object(module, name), attributes)!r},")

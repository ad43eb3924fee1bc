"""Loading with transformers' semantics, plus the two refusals a silent load would hide
(docs/reliability.md, 'Loading checkpoints').

As in transformers: a weight the checkpoint lacks (a new task head, a layer an edited config adds) is
initialised and listed as MISSING in the load report; a weight whose shape differs from the model's is an
error unless `ignore_mismatched_sizes=True`; the weights of another class's task head (`classifier`,
`lm_head`) are left unused and listed as UNEXPECTED.

Refused here:
- a checkpoint of another model type (`config.json` names `ddl_mhc` where a `ddcl_incrt` class loads it, or
  the reverse): transformers only warns and then fails on whatever field of the other config does not fit;
- unexpected weights of the base model (under `base_model_prefix`, or named after one of its modules): the
  file holds encoder or decoder weights the config does not build (a head count or layer count edited down,
  another model's weights), so the loaded model would compute another function. Every class refuses them,
  base or task model. `strict=False` drops them with transformers' warning.
"""

_SHOWN_KEYS = 12
# `from_pretrained` arguments that say where and how to fetch a checkpoint's files (config.json included)
DOWNLOAD_KWARGS = (
    "cache_dir",
    "force_download",
    "proxies",
    "token",
    "local_files_only",
    "revision",
    "subfolder",
)


def _named(keys: list[str]) -> str:
    ordered = sorted(keys)
    shown = ", ".join(ordered[:_SHOWN_KEYS])
    return f"[{shown}{f', ... ({len(ordered) - _SHOWN_KEYS} more)' if len(ordered) > _SHOWN_KEYS else ''}]"


def check_model_type(model_class, pretrained_model_name_or_path, kwargs: dict) -> None:
    """The checkpoint's `model_type` is `model_class`'s: loading another model's folder is an error naming
    both types (transformers warns, then fails on a field of the other config)."""
    download = {name: kwargs[name] for name in DOWNLOAD_KWARGS if name in kwargs}
    config_dict, _ = model_class.config_class.get_config_dict(pretrained_model_name_or_path, **download)
    saved, expected = config_dict.get("model_type"), model_class.config_class.model_type
    if saved is not None and saved != expected:
        raise ValueError(
            f"{pretrained_model_name_or_path} holds a `{saved}` model (config.json model_type), but "
            f"{model_class.__name__} loads `{expected}` checkpoints: use the class of that model type, or an "
            "Auto class (AutoModel, ...), which picks it from config.json"
        )


def refuse_foreign_base_keys(model, unexpected_keys: list[str]) -> None:
    """ValueError when `unexpected_keys` name base-model weights: under `base_model_prefix` (a task
    checkpoint's naming) or starting with one of the base model's top-level modules, built or left out by the
    config (`bert_encoder = None`), as a base checkpoint names them."""
    prefix = f"{model.base_model_prefix}."
    base = model.base_model
    modules = {name for name, _ in base.named_children()}
    modules |= {name for name, value in vars(base).items() if value is None and not name.startswith("_")}
    foreign = [key for key in unexpected_keys if key.startswith(prefix) or key.split(".")[0] in modules]
    if foreign:
        raise ValueError(
            f"the checkpoint holds base-model weights that the {type(model).__name__} its config builds has "
            f"no place for: {_named(foreign)} (an edited config.json, e.g. fewer heads or layers than were "
            "saved, or another model's weights?). Restore the saved config, or pass `strict=False` to drop "
            "them"
        )


__all__ = ["DOWNLOAD_KWARGS", "check_model_type", "refuse_foreign_base_keys"]

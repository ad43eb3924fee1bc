"""Strict `from_pretrained`: weights that do not fit the model built from the config are an error.

transformers initialises missing weights at random and drops unexpected ones with only a load-report
warning; for these models that silently yields a different model (a dropped `lm_head`, one head's `k_proj`,
a config edited to more layers, another model's weights). Here any missing or unexpected key raises
ValueError naming the keys. Weights tied by `_tied_weights_keys` (e.g. `lm_head` to the embeddings) are not
missing: transformers ties them before the check.

Loading another class of the same family keeps working as in transformers: the base model from a task
checkpoint leaves the task head's weights unused, a task model on a base checkpoint starts a new head
(missing keys outside `base_model_prefix`); weights missing inside the base model still raise. Pass
`strict=False` for a deliberate partial load (transformers' behaviour: initialise, drop, warn).
"""

_SHOWN_KEYS = 12


def _named(keys: set[str]) -> str:
    ordered = sorted(keys)
    shown = ", ".join(ordered[:_SHOWN_KEYS])
    return f"[{shown}{f', ... ({len(ordered) - _SHOWN_KEYS} more)' if len(ordered) > _SHOWN_KEYS else ''}]"


class StrictLoadingMixin:
    """`from_pretrained(..., strict=True)` (module docstring)."""

    @classmethod
    def from_pretrained(cls, *args, strict: bool = True, **kwargs):
        if not isinstance(strict, bool):
            raise TypeError(f"`strict` must be a bool, got {type(strict).__name__} ({strict!r})")
        output_loading_info = kwargs.pop("output_loading_info", False)
        model, loading_info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        if strict:
            missing = set(loading_info["missing_keys"])
            unexpected = set(loading_info["unexpected_keys"])
            saved_as = model.config.architectures or [type(model).__name__]
            if type(model).__name__ not in saved_as:  # another class of the family: heads differ
                if model.base_model is model:  # a task checkpoint's head weights are not ours
                    modules = {key.split(".")[0] for key in model.state_dict()}
                    unexpected = {key for key in unexpected if key.split(".")[0] in modules}
                else:  # a new task head on a base checkpoint
                    prefix = f"{model.base_model_prefix}."
                    missing = {key for key in missing if key.startswith(prefix)}
            if missing or unexpected:
                raise ValueError(
                    f"the checkpoint's weights do not match the {type(model).__name__} its config builds "
                    f"(an interrupted or mixed save, an edited config, or another model's weights?): missing "
                    f"{_named(missing)}, unexpected {_named(unexpected)}. Pass `strict=False` to load anyway "
                    "(missing weights initialised at random, unexpected ones dropped)"
                )
        return (model, loading_info) if output_loading_info else model


__all__ = ["StrictLoadingMixin"]

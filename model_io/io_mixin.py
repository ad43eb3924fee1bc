"""The one mixin on the geoformers model classes (docs/reliability.md, 'Saving', 'Hub code', 'Loading
checkpoints'): `save_pretrained` ships the code (`remote_code`) and replaces the folder atomically
(`atomic_save`), `from_pretrained` refuses another model's checkpoint (`strict_loading`), and `push_to_hub`
says what it needs where the Hub cannot be reached. Everything else is transformers' `PreTrainedModel`.

The model files import it in a `try` block, so a Hub copy of them loaded without geoformers runs on
transformers' own saving and loading (`remote_code`). A class loaded as remote code (module outside
geoformers) keeps transformers' behaviour too, whose `custom_object_save` re-ships its flat files.
"""

import os

from huggingface_hub import constants
from huggingface_hub.errors import HfHubHTTPError, HTTPError

from geoformers.model_io.atomic_save import SAVE_SIGNATURE, atomic_save_pretrained
from geoformers.model_io.remote_code import is_internal, write_remote_code
from geoformers.model_io.strict_loading import check_model_type, refuse_foreign_base_keys


class PretrainedIOMixin:
    """Saving, Hub code and strict loading for a `PreTrainedModel` subclass (module docstring)."""

    @classmethod
    def is_remote_code(cls) -> bool:
        """A geoformers class is never remote code: its code ships with every save whether or not it is
        registered for an auto class (`register_for_auto_class` changes nothing)."""
        return super().is_remote_code() and not is_internal(cls.__module__)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, strict: bool = True, **kwargs):
        """transformers' `from_pretrained`; another model type's folder is refused, and with `strict=True` so
        are base-model weights the config does not build (`strict_loading`)."""
        if not isinstance(strict, bool):
            raise TypeError(f"`strict` must be a bool, got {type(strict).__name__} ({strict!r})")
        if kwargs.get("config") is None and pretrained_model_name_or_path is not None:
            check_model_type(cls, pretrained_model_name_or_path, kwargs)
        output_loading_info = kwargs.pop("output_loading_info", False)
        model, loading_info = super().from_pretrained(
            pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs
        )
        if strict:
            refuse_foreign_base_keys(model, loading_info["unexpected_keys"])
        return (model, loading_info) if output_loading_info else model

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs):
        """transformers' `save_pretrained` with the model's code files and `auto_map` added, written into a
        staging folder that replaces `save_directory` when complete."""
        if not is_internal(type(self).__module__):
            return super().save_pretrained(save_directory, *args, **kwargs)
        if type(self.config).is_remote_code():
            raise ValueError(
                f"{type(self.config).__name__} is registered for an auto class: transformers would ship its "
                "nested source (register_for_auto_class), which does not import on its own; geoformers "
                "configs need none, save_pretrained ships the code"
            )
        parent_save = super().save_pretrained

        def save_with_code(folder, *args, **kwargs):
            arguments = SAVE_SIGNATURE.bind(self, folder, *args, **kwargs).arguments
            if self.should_save_on_this_rank(arguments.get("is_main_process", True)):
                os.makedirs(folder, exist_ok=True)
                self.config.auto_map = write_remote_code(self, folder)
            return parent_save(folder, *args, **kwargs)

        return atomic_save_pretrained(self, save_with_code, save_directory, *args, **kwargs)

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


__all__ = ["PretrainedIOMixin"]

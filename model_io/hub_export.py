"""Hub export: one folder with the weights, the flat remote code and `auto_map` (written by every
`save_pretrained`, see `remote_code`), the tokenizer and a model card generated from the model, that loads
with `trust_remote_code=True` on a machine without `geoformers`; `huggingface_hub.upload_folder` uploads it
as is.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from geoformers.model_io.atomic_save import replace_folder, staging_folder
from geoformers.model_io.model_card import model_card
from geoformers.model_io.remote_code import is_internal


def export_for_hub(
    model, tokenizer, folder: str | os.PathLike, metrics: Mapping[str, float] | None = None
) -> Path:
    """Write `model` (+ `tokenizer`, may be None) as a folder that loads with `trust_remote_code=True`,
    with a README.md model card listing `metrics` (name -> value measured on this model; None: no results).

    The folder is built in a temporary sibling and swapped into place only when complete
    (`atomic_save.replace_folder`): an interrupted export leaves the previous folder as it was.
    """
    config = getattr(model, "config", None)
    if not is_internal(type(model).__module__) or not is_internal(type(config).__module__):
        raise TypeError(f"export_for_hub expects a geoformers model, got {type(model).__name__}")
    card = model_card(model, metrics)
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_folder(folder)
    try:
        model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        card.save(staging / "README.md")
        replace_folder(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder

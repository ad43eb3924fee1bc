"""`import geoformers` loads the models and the Auto registration only; every exported name of the package
and its subpackages resolves on first access (docs/README.md, 'Import cost')."""

import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("geoformers", "geoformers.models", "geoformers.training", "geoformers.tokenization")
# what a user of one model never calls at import: the training stack, plotting, PEFT, the conversions
NOT_AT_IMPORT = (
    "datasets",
    "evaluate",
    "matplotlib",
    "peft",
    "sklearn",
    "geoformers.training",
    "geoformers.tokenization",
    "geoformers.models.ddcl_incrt.bert_conversion",
    "geoformers.models.ddl_mhc.llama_conversion",
    "geoformers.model_io.hub_export",
)
PROBE = f"""
import json, sys
import geoformers
from transformers import conversion_mapping
# transformers' table of every model's weight conversions (about 1 s to build) waits for the first load
table_built = conversion_mapping._checkpoint_conversion_mapping_cache is not None
from transformers import AutoConfig, AutoModelForCausalLM
model = AutoModelForCausalLM.from_config(AutoConfig.for_model("ddl_mhc", hidden_size=32, num_hidden_layers=1,
    num_attention_heads=2, intermediate_size=64, vocab_size=50, hc_streams=2))
print(json.dumps({{"loaded": [m for m in {NOT_AT_IMPORT!r} if m in sys.modules],
                   "model": type(model).__name__, "table_built": table_built}}))
"""


def test_import_loads_the_models_only_and_registers_them():
    env = {"PYTHONPATH": str(ROOT.parent), "OMP_NUM_THREADS": "1", "PATH": ""}
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    outcome = json.loads(run.stdout.splitlines()[-1])
    assert outcome == {"loaded": [], "model": "DDLmHCForCausalLM", "table_built": False}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_resolves(package):
    module = importlib.import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        assert getattr(value, "__name__", name) == name, f"{package}.{name} resolved to {value!r}"
        assert name in dir(module)
    # a lazy name equal to a submodule's would be shadowed by that submodule once something imports it
    lazy = set(getattr(module, "_LAZY", {}))
    assert not lazy & {info.name for info in pkgutil.iter_modules(module.__path__)}


@pytest.mark.parametrize("package", PACKAGES)
def test_unknown_names_raise_attribute_error(package):
    module = importlib.import_module(package)
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name  # noqa: B018
    assert not hasattr(module, "no_such_name")

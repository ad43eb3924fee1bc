"""The supported transformers range in saved folders (docs/versions.md, 'Saved folders'): every code file a
folder ships checks it before any other import; the folder loads under a transformers inside the range and,
under one outside it, fails with one ImportError naming the installed and the required versions, never with
an ImportError on a transformers internal.

The out-of-range load needs a transformers release below the range in a folder of its own (`pip install
--no-deps --target DIR transformers==5.17.0`, named by GEOFORMERS_OUT_OF_RANGE_TRANSFORMERS), used in front
of this environment's packages: `bash scripts/dev.sh min` makes it and runs this file in the minimum-versions
environment, whose huggingface-hub and tokenizers that release accepts. The folder is saved by the
interpreter GEOFORMERS_SAVING_PYTHON names (there: the main environment's), else by this one."""

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

from geoformers.model_io.remote_code import flat_name
from geoformers.models import transformers_range
from geoformers.models.transformers_range import TRANSFORMERS_REQUIREMENT

INPUTS = [[1, 5, 7, 3, 2]]
# argv[1]: the folder; saves a DDL-mHC causal LM and a DDCL-INCRT classifier (export_for_hub) under it and
# prints their logits on INPUTS and the saving transformers' version.
SAVE = textwrap.dedent(
    """
    import json, sys, torch, transformers, geoformers
    torch.manual_seed(0)
    models = {
        "lm": geoformers.DDLmHCForCausalLM(geoformers.DDLmHCConfig(
            vocab_size=16, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, hc_streams=2)),
        "encoder": geoformers.DDCLIncrtForSequenceClassification(geoformers.DDCLIncrtConfig(
            vocab_size=16, hidden_size=16, num_hidden_layers=1, num_heads=1, head_dim=8, num_labels=2)),
    }
    logits = {}
    for name, model in models.items():
        geoformers.export_for_hub(model.eval(), None, f"{sys.argv[1]}/{name}")
        with torch.no_grad():
            logits[name] = model(input_ids=torch.tensor(json.loads(sys.argv[2]))).logits.tolist()
    print(json.dumps({"transformers": transformers.__version__, "logits": logits}))
    """
)
# argv[1]: the folder; loads both models with trust_remote_code=True where `import geoformers` is refused
# and prints, per model, its logits on argv[2] or the error raised.
LOAD = textwrap.dedent(
    """
    import importlib.abc, json, sys
    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "geoformers" or name.startswith("geoformers."):
                raise ImportError("geoformers is blocked in this test")
    sys.meta_path.insert(0, Refuse())
    import torch, transformers
    results = {"transformers": transformers.__version__}
    ids = torch.tensor(json.loads(sys.argv[2]))
    for name, auto in (("lm", "AutoModelForCausalLM"), ("encoder", "AutoModelForSequenceClassification")):
        try:
            folder = f"{sys.argv[1]}/{name}"
            model = getattr(transformers, auto).from_pretrained(folder, trust_remote_code=True)
            with torch.no_grad():
                results[name] = {"logits": model.eval()(input_ids=ids).logits.tolist()}
        except Exception as error:
            results[name] = {"error": type(error).__name__, "message": str(error),
                             "chained": error.__cause__ is not None or error.__context__ is not None}
    print(json.dumps(results))
    """
)


def run(python: str, script: str, folder: Path, tmp_path: Path, pythonpath: str | None = None) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    completed = subprocess.run(
        [python, "-c", script, str(folder), json.dumps(INPUTS)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, dict]:
    """The folders and their models' logits, saved by GEOFORMERS_SAVING_PYTHON (else this interpreter)."""
    tmp_path = tmp_path_factory.mktemp("saved")
    python = os.environ.get("GEOFORMERS_SAVING_PYTHON") or sys.executable
    return tmp_path / "folders", run(python, SAVE, tmp_path / "folders", tmp_path)


def test_the_files_a_folder_loads_first_check_the_range_before_their_other_imports(saved):
    """transformers imports the files `auto_map` names (the configuration, then the model) before any other
    code file of the folder; each checks the range first, so no other file is imported outside it."""
    folders, _ = saved
    range_file = f"{flat_name(transformers_range.__name__)}.py"
    for folder in (folders / "lm", folders / "encoder"):
        assert TRANSFORMERS_REQUIREMENT in (folder / range_file).read_text(encoding="utf-8")
        auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
        entries = {reference.split(".")[0] + ".py" for reference in auto_map.values()}
        assert len(entries) == 2, auto_map
        for name in entries:
            tree = ast.parse((folder / name).read_text(encoding="utf-8"))
            imports = [
                node
                for node in tree.body
                if isinstance(node, ast.Import | ast.ImportFrom)
                and getattr(node, "module", "") != "__future__"
            ]
            first = imports[0]
            assert isinstance(first, ast.ImportFrom) and first.level == 1, name
            assert (first.module, [a.name for a in first.names]) == (
                flat_name(transformers_range.__name__),
                ["TRANSFORMERS_REQUIREMENT"],
            ), name


def test_a_transformers_inside_the_range_loads_the_folders_with_the_saved_logits(saved, tmp_path):
    folders, reference = saved
    results = run(sys.executable, LOAD, folders, tmp_path)
    assert Requirement(TRANSFORMERS_REQUIREMENT).specifier.contains(results["transformers"])
    for name in ("lm", "encoder"):
        assert "logits" in results[name], results[name]
        torch.testing.assert_close(
            torch.tensor(results[name]["logits"]), torch.tensor(reference["logits"][name])
        )


def test_a_transformers_outside_the_range_gets_one_message_naming_both_versions(saved, tmp_path):
    old = os.environ.get("GEOFORMERS_OUT_OF_RANGE_TRANSFORMERS")
    if not old:
        pytest.skip("GEOFORMERS_OUT_OF_RANGE_TRANSFORMERS names no folder with an older transformers")
    folders, reference = saved
    results = run(sys.executable, LOAD, folders, tmp_path, pythonpath=old)
    installed = results["transformers"]
    assert not Requirement(TRANSFORMERS_REQUIREMENT).specifier.contains(installed)
    for name in ("lm", "encoder"):
        assert results[name]["error"] == "ImportError", results[name]
        message = results[name]["message"]
        assert f"supports {TRANSFORMERS_REQUIREMENT}, but transformers {installed} is installed" in message
        assert f"pip install '{TRANSFORMERS_REQUIREMENT}'" in message
        assert "cannot import name" not in message and not results[name]["chained"], results[name]

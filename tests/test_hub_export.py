"""Hub export: flat code files that load with `trust_remote_code=True` where `import geoformers` fails,
written by `export_for_hub` and by the stock `save_pretrained` / `push_to_hub`; cards made from the model."""

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from fake_hub import faked_hub
from transformers import AutoModelForSequenceClassification

import geoformers  # registers the Auto classes
from geoformers import DDCLIncrtConfig, DDCLIncrtForSequenceClassification, DDLmHCConfig, DDLmHCForCausalLM
from geoformers.model_io import remote_code
from geoformers.model_io.hub_export import export_for_hub
from geoformers.model_io.remote_code import remote_code_files, shipped_source
from geoformers.tokenization import build_char_tokenizer

# Runs in a fresh interpreter with every `geoformers` import refused, so only the exported files can work.
# argv[1]: a JSON list of jobs {"folder", "auto_class", "inputs"[, "resave_to"]} or {"folder", "text"} (the
# tokenizer); prints the list of their results.
BLOCKED_LOADER = textwrap.dedent(
    """
    import importlib.abc, json, sys
    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "geoformers" or name.startswith("geoformers."):
                raise ImportError("geoformers is blocked in this test")
    sys.meta_path.insert(0, Refuse())
    try:
        import geoformers  # noqa: F401
        raise SystemExit("geoformers should not be importable here")
    except ImportError:
        pass
    import torch, transformers
    results = []
    for job in json.loads(sys.argv[1]):
        if "text" in job:  # the tokenizer, asked both ways (without the argument transformers asks)
            result = {}
            for trust in (False, True):
                tokenizer = transformers.AutoTokenizer.from_pretrained(job["folder"], trust_remote_code=trust)
                ids = tokenizer(job["text"]).input_ids
                result[str(trust)] = {"class": type(tokenizer).__name__, "ids": ids,
                                      "decoded": tokenizer.decode(ids)}
            results.append(result)
            continue
        auto_class = getattr(transformers, job["auto_class"])
        model = auto_class.from_pretrained(job["folder"], trust_remote_code=True).eval()
        ids = torch.tensor(job["inputs"])
        with torch.no_grad():
            result = {"logits": model(input_ids=ids).logits.tolist(), "class": type(model).__module__}
        if hasattr(model, "generate"):
            result["generated"] = model.generate(ids, max_new_tokens=6, do_sample=False).tolist()
        if "resave_to" in job:  # save the remote-code copy again (transformers' custom_object_save), reload
            model.save_pretrained(job["resave_to"])
            again = auto_class.from_pretrained(job["resave_to"], trust_remote_code=True).eval()
            with torch.no_grad():
                result["resaved_logits"] = again(input_ids=ids).logits.tolist()
        results.append(result)
    print(json.dumps(results))
    """
)


def run_without_geoformers(jobs: list[dict], tmp_path: Path) -> tuple[list[dict], str]:
    """The loader's results and everything it printed (stdout + stderr)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    completed = subprocess.run(
        [sys.executable, "-c", BLOCKED_LOADER, json.dumps(jobs, default=str)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1]), completed.stdout + completed.stderr


def load_without_geoformers(folder: Path, auto_class: str, input_ids: torch.Tensor, tmp_path: Path) -> dict:
    job = {"folder": str(folder), "auto_class": auto_class, "inputs": input_ids.tolist()}
    return run_without_geoformers([job], tmp_path)[0][0]


def grown_incrt_model() -> DDCLIncrtForSequenceClassification:
    torch.manual_seed(0)
    config = DDCLIncrtConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_heads=1,
        head_dim=8,
        num_prototypes=4,
        max_position_embeddings=16,
        num_labels=3,
    )
    model = DDCLIncrtForSequenceClassification(config)
    model.grow_head(0)
    model.grow_head(1)
    model.grow_head(1)
    for parameter in model.parameters():  # grown heads start with zero output; make them count
        parameter.data.add_(0.05 * torch.randn_like(parameter))
    return model.eval()


def test_shipped_files_are_the_modules_with_only_their_top_level_geoformers_import_lines_made_relative():
    files = remote_code_files(
        "geoformers.models.ddcl_incrt.modeling_ddcl_incrt",
        "geoformers.models.ddcl_incrt.configuration_ddcl_incrt",
    )
    assert {
        "modeling_ddcl_incrt.py",
        "configuration_ddcl_incrt.py",
        "incrt.py",
        "prototypes.py",
        "config_validation.py",
        "transformers_range.py",
    } <= set(files)
    assert not [name for name in files if name.startswith("model_io")]  # saving and loading stay home
    for name, source in files.items():
        module = next(
            m
            for m in sys.modules
            if m.startswith("geoformers.models.") and remote_code.flat_name(m) == name[:-3]
        )
        original = Path(sys.modules[module].__file__).read_text().splitlines()
        shipped = source.splitlines()
        assert len(shipped) == len(original), name
        for before, after in zip(original, shipped, strict=True):
            if before.startswith(
                "from geoformers."
            ):  # `from geoformers.<a>.<b> import` -> `from .<a>_<b> import`
                imported = before.split()[1]
                flat = remote_code.flat_name(imported)
                assert after == before.replace(f"from {imported} import", f"from .{flat} import")
            else:
                assert after == before, name
        tree = ast.parse(source)
        for node in tree.body:  # every top-level relative import is shipped; no top-level geoformers import
            if isinstance(node, ast.ImportFrom) and node.level:
                assert f"{node.module}.py" in files, (name, node.module)
            elif isinstance(node, ast.ImportFrom | ast.Import):
                modules = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not any(m.startswith("geoformers") for m in modules), name
    assert "from .configuration_ddcl_incrt import DDCLIncrtConfig" in files["modeling_ddcl_incrt.py"]


def test_a_package_ships_as_its_flat_name_and_two_modules_of_one_flat_name_are_refused(monkeypatch):
    files = remote_code_files("geoformers.models.ddl_mhc.ops.charts")  # a package: its __init__.py
    assert "from .ops_charts_naive import" in files["ops_charts.py"]
    assert remote_code.flat_name("geoformers.models.input_checks") == "input_checks"  # shared by both models
    with pytest.raises(ValueError, match="only the models' code ships"):
        remote_code.flat_name("geoformers.training.growth")
    fake = {
        "geoformers.models.a_b.c": ("", ("geoformers.models.a.b_c",)),
        "geoformers.models.a.b_c": ("", ()),
    }
    monkeypatch.setattr(remote_code, "shipped_source", fake.__getitem__)
    with pytest.raises(
        ValueError,
        match="geoformers.models.a_b.c and geoformers.models.a.b_c would both be shipped as a_b_c.py",
    ):
        remote_code_files("geoformers.models.a_b.c")


def test_the_triton_kernels_imported_by_name_are_not_shipped():
    files = remote_code_files(
        "geoformers.models.ddl_mhc.modeling_ddl_mhc", "geoformers.models.ddl_mhc.configuration_ddl_mhc"
    )
    shipped = {"ops_dispatch.py", "ops_charts.py", "ops_stream_write.py"}
    assert shipped <= set(files)
    assert not [name for name in files if name.removesuffix(".py").endswith("triton")]


@pytest.mark.parametrize(
    "line",
    [
        "import geoformers.models.ddl_mhc.modeling_ddl_mhc",
        "from geoformers import DDLmHCConfig",
        "    import geoformers",
    ],
    ids=["import", "package root", "indented"],
)
def test_a_geoformers_import_that_cannot_be_made_relative_fails_the_save_loudly(tmp_path, monkeypatch, line):
    module = tmp_path / "odd_module.py"
    module.write_text(f'"""A module."""\n\nimport torch\n\nif torch:\n{line}\n')
    real_source_file = remote_code.source_file
    monkeypatch.setattr(
        remote_code,
        "source_file",
        lambda name: str(module) if name == "geoformers.odd_module" else real_source_file(name),
    )
    with pytest.raises(
        ValueError, match=re.escape("only `from geoformers.<module> import <names>`")
    ) as error:
        shipped_source("geoformers.odd_module")
    assert "odd_module.py:6" in str(error.value)


def test_an_indented_geoformers_import_is_left_for_its_except_branch(tmp_path, monkeypatch):
    """A `try` block's import (what the forward does not need, e.g. `model_io`) is neither rewritten nor
    shipped; in a copy loaded without geoformers its `except ImportError` branch runs."""
    module = tmp_path / "optional_module.py"
    guarded = "try:\n    from geoformers.model_io.io_mixin import Mixin\nexcept ImportError:\n    pass\n"
    module.write_text(f"from geoformers.models.value_checks import checks_values\n\n{guarded}")
    real_source_file = remote_code.source_file
    monkeypatch.setattr(
        remote_code,
        "source_file",
        lambda name: str(module) if name == "geoformers.optional_module" else real_source_file(name),
    )
    source, imported = shipped_source("geoformers.optional_module")
    assert source == f"from .value_checks import checks_values\n\n{guarded}"
    assert imported == ("geoformers.models.value_checks",)


def test_grown_ddcl_incrt_loads_anywhere_with_identical_logits(tmp_path):
    model = grown_incrt_model()
    folder = export_for_hub(model, None, tmp_path / "export")
    config = json.loads((folder / "config.json").read_text())
    assert config["num_heads"] == [2, 3]
    assert config["auto_map"] == {
        "AutoConfig": "configuration_ddcl_incrt.DDCLIncrtConfig",
        "AutoModel": "modeling_ddcl_incrt.DDCLIncrtModel",
        "AutoModelForSequenceClassification": "modeling_ddcl_incrt.DDCLIncrtForSequenceClassification",
    }
    assert model.config.auto_map == config["auto_map"]  # as transformers' custom_object_save sets it
    input_ids = torch.randint(5, 50, (2, 9))
    with torch.no_grad():
        expected = model(input_ids=input_ids).logits
    loaded = load_without_geoformers(folder, "AutoModelForSequenceClassification", input_ids, tmp_path)
    assert loaded["class"].startswith("transformers_modules")
    torch.testing.assert_close(torch.tensor(loaded["logits"]), expected, atol=1e-6, rtol=0)


def test_failed_export_leaves_no_folder(tmp_path, monkeypatch):
    model = grown_incrt_model()

    def broken_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(model, "save_pretrained", broken_save)
    with pytest.raises(OSError, match="disk full"):
        export_for_hub(model, None, tmp_path / "export")
    assert list(tmp_path.iterdir()) == []


def test_export_rejects_foreign_models(tmp_path):
    with pytest.raises(TypeError, match="geoformers model"):
        export_for_hub(torch.nn.Linear(2, 2), None, tmp_path / "export")


@pytest.fixture
def fake_hub():
    with faked_hub() as hub:
        yield hub


def test_ddl_mhc_loads_anywhere_with_identical_logits_and_tokens(tmp_path):
    torch.manual_seed(0)
    config = DDLmHCConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        hc_streams=4,
        hc_chart="rtbp",
        residual="delta",
        stream_expansion="conv",
    )
    model = DDLmHCForCausalLM(config).eval()
    for parameter in model.parameters():  # move off the near-identity initialisation
        parameter.data.add_(0.05 * torch.randn_like(parameter))
    tokenizer = build_char_tokenizer("abcdefghijklmnopqrstuvwxyz .,")
    folder = export_for_hub(model, tokenizer, tmp_path / "export")
    assert json.loads((folder / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"] == (
        "modeling_ddl_mhc.DDLmHCForCausalLM"
    )
    input_ids = torch.randint(3, 40, (2, 7))
    with torch.no_grad():
        expected_logits = model(input_ids=input_ids).logits
        expected_tokens = model.generate(input_ids, max_new_tokens=6, do_sample=False)
    loaded = load_without_geoformers(folder, "AutoModelForCausalLM", input_ids, tmp_path)
    torch.testing.assert_close(torch.tensor(loaded["logits"]), expected_logits, atol=1e-5, rtol=0)
    assert loaded["generated"] == expected_tokens.tolist()


def tiny_ddl_mhc() -> DDLmHCForCausalLM:
    torch.manual_seed(0)
    config = DDLmHCConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        hc_streams=4,
        hc_chart="tbp",
        residual="delta",
    )
    model = DDLmHCForCausalLM(config).eval()
    for parameter in model.parameters():
        parameter.data.add_(0.05 * torch.randn_like(parameter))
    return model


def test_export_for_hub_is_importable_from_the_package():
    assert geoformers.export_for_hub is export_for_hub


def test_stock_save_pretrained_writes_flat_code_and_auto_map(tmp_path):
    model = grown_incrt_model()
    folder = tmp_path / "saved"
    model.save_pretrained(folder)
    saved = {p.name for p in folder.iterdir()}
    code = remote_code_files(
        "geoformers.models.ddcl_incrt.modeling_ddcl_incrt",
        "geoformers.models.ddcl_incrt.configuration_ddcl_incrt",
    )
    assert saved == {"config.json", "model.safetensors", *code}
    assert all((folder / name).read_text() == source for name, source in code.items())
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert auto_map == {
        "AutoConfig": "configuration_ddcl_incrt.DDCLIncrtConfig",
        "AutoModel": "modeling_ddcl_incrt.DDCLIncrtModel",
        "AutoModelForSequenceClassification": "modeling_ddcl_incrt.DDCLIncrtForSequenceClassification",
    }
    assert model.config.auto_map == auto_map  # kept on the live config, as transformers does
    # with geoformers imported the local classes win, with no remote-code question asked
    local = AutoModelForSequenceClassification.from_pretrained(folder)
    assert type(local) is DDCLIncrtForSequenceClassification and local.config.num_heads == [2, 3]


def test_register_for_auto_class_does_not_ship_the_nested_package_files(tmp_path, monkeypatch):
    """transformers' route (register, then custom_object_save on save) would copy ddl_mhc.py, whose
    geoformers imports cannot load: a registered model class still ships the flat files and their auto_map,
    a registered config class is refused with the reason."""
    monkeypatch.setattr(DDLmHCForCausalLM, "_auto_class", None)
    monkeypatch.setattr(DDLmHCConfig, "_auto_class", None)
    DDLmHCForCausalLM.register_for_auto_class("AutoModelForCausalLM")
    model = tiny_ddl_mhc()
    model.save_pretrained(tmp_path / "saved")
    files = {p.name for p in (tmp_path / "saved").iterdir()}
    code = remote_code_files(
        "geoformers.models.ddl_mhc.modeling_ddl_mhc", "geoformers.models.ddl_mhc.configuration_ddl_mhc"
    )
    assert files == {"config.json", "generation_config.json", "model.safetensors", *code}
    assert "ddl_mhc.py" not in files
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["auto_map"] == {
        "AutoConfig": "configuration_ddl_mhc.DDLmHCConfig",
        "AutoModel": "modeling_ddl_mhc.DDLmHCModel",
        "AutoModelForCausalLM": "modeling_ddl_mhc.DDLmHCForCausalLM",
    }
    DDLmHCConfig.register_for_auto_class()
    with pytest.raises(ValueError, match="DDLmHCConfig is registered for an auto class"):
        model.save_pretrained(tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def write_uploaded(files: dict[str, bytes], folder: Path) -> Path:
    folder.mkdir()
    for name, content in files.items():
        (folder / name).write_bytes(content)
    return folder


def test_stock_push_to_hub_uploads_model_code_and_a_standard_tokenizer(fake_hub):
    tiny_ddl_mhc().push_to_hub("user/ddl-mhc-tiny", token="hf_fake")
    build_char_tokenizer("abcdefghij").push_to_hub("user/ddl-mhc-tiny", token="hf_fake")
    expected = {
        "config.json",
        "model.safetensors",
        "configuration_ddl_mhc.py",
        "modeling_ddl_mhc.py",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    assert expected <= set(fake_hub.files)
    assert json.loads(fake_hub.files["config.json"])["auto_map"]["AutoModelForCausalLM"] == (
        "modeling_ddl_mhc.DDLmHCForCausalLM"
    )
    assert json.loads(fake_hub.files["tokenizer_config.json"])["tokenizer_class"] == "TokenizersBackend"


def test_stock_saves_and_pushes_load_and_resave_anywhere(fake_hub, tmp_path):
    """One geoformers-free interpreter loads a stock `save_pretrained` folder (and saves it again), a stock
    `push_to_hub` repo (logits and greedy tokens) and that repo's tokenizer (asked with trust_remote_code
    False and True: no prompt, no code run for it)."""
    encoder, lm = grown_incrt_model(), tiny_ddl_mhc()
    tokenizer = build_char_tokenizer("abcdefghijklmnopqrstuvwxyz .,")
    encoder.save_pretrained(tmp_path / "saved")
    lm.push_to_hub("user/ddl-mhc-tiny", token="hf_fake")
    tokenizer.push_to_hub("user/ddl-mhc-tiny", token="hf_fake")
    repo = write_uploaded(fake_hub.files, tmp_path / "repo")
    encoder_ids, lm_ids, text = torch.randint(5, 50, (2, 9)), torch.randint(3, 40, (2, 7)), "hello, world."
    with torch.no_grad():
        encoder_logits, lm_logits = encoder(input_ids=encoder_ids).logits, lm(input_ids=lm_ids).logits
        lm_tokens = lm.generate(lm_ids, max_new_tokens=6, do_sample=False)
    jobs = [
        {
            "folder": tmp_path / "saved",
            "auto_class": "AutoModelForSequenceClassification",
            "inputs": encoder_ids.tolist(),
            "resave_to": tmp_path / "resaved",
        },
        {"folder": repo, "auto_class": "AutoModelForCausalLM", "inputs": lm_ids.tolist()},
        {"folder": repo, "text": text},
    ]
    (saved, pushed, tokenized), printed = run_without_geoformers(jobs, tmp_path)
    assert saved["class"].startswith("transformers_modules")
    torch.testing.assert_close(torch.tensor(saved["logits"]), encoder_logits, atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.tensor(saved["resaved_logits"]), encoder_logits, atol=1e-6, rtol=0)
    assert json.loads((tmp_path / "resaved" / "config.json").read_text())["auto_map"]["AutoConfig"] == (
        "configuration_ddcl_incrt.DDCLIncrtConfig"
    )
    torch.testing.assert_close(torch.tensor(pushed["logits"]), lm_logits, atol=1e-5, rtol=0)
    assert pushed["generated"] == lm_tokens.tolist()
    expected = {"class": "TokenizersBackend", "ids": tokenizer(text).input_ids, "decoded": text}
    assert tokenized == {"False": expected, "True": expected}
    assert "Do you wish to run the custom code" not in printed


def test_save_pretrained_with_push_to_hub_uploads_the_code_too(fake_hub, tmp_path):
    model = tiny_ddl_mhc()
    model.save_pretrained(tmp_path / "local", push_to_hub=True, repo_id="user/ddl-mhc-tiny", token="hf_fake")
    assert fake_hub.created == ["ddl-mhc-tiny"]
    local = {p.name for p in (tmp_path / "local").iterdir()}
    assert {"configuration_ddl_mhc.py", "modeling_ddl_mhc.py", "config.json", "model.safetensors"} <= local
    assert set(fake_hub.files) == local
    assert fake_hub.files["modeling_ddl_mhc.py"] == (tmp_path / "local" / "modeling_ddl_mhc.py").read_bytes()


# ----------------------------------------------------------------------------------------- model cards


def test_model_card_describes_the_exported_model_and_no_benchmark(tmp_path):
    model = tiny_ddl_mhc()
    card = (export_for_hub(model, None, tmp_path / "export") / "README.md").read_text()
    rows = dict(line.strip("|").rsplit("|", 1) for line in card.splitlines() if line.startswith("| `"))
    rows = {key.split("`")[1]: value.strip() for key, value in rows.items()}
    assert rows["num_hidden_layers"] == "2" and rows["hidden_size"] == "32"
    assert rows["num_attention_heads"] == "4" and rows["hc_streams"] == "4" and rows["hc_chart"] == "tbp"
    assert f"| parameters | {sum(p.numel() for p in model.parameters()):,} |" in card
    assert "No evaluation results were recorded" in card
    assert "1.6656" not in card and "width 128" not in card  # the benchmark card's run, not this model
    assert "pipeline_tag: text-generation" in card and "library_name: transformers" in card
    assert "The code supports `transformers>=5.24,<6`" in card  # the range its code checks (docs/versions.md)


def test_model_card_lists_only_the_metrics_passed_in(tmp_path):
    model = grown_incrt_model()
    metrics = {"eval_accuracy": 0.8125, "eval_loss": 0.5}
    folder = export_for_hub(model, None, tmp_path / "export", metrics=metrics)
    card = (folder / "README.md").read_text()
    assert "| eval_accuracy | 0.8125 |" in card and "| eval_loss | 0.5 |" in card
    assert "No evaluation results" not in card
    assert "| `num_heads` (attention heads per layer) | [2, 3] |" in card


@pytest.mark.parametrize(
    ("metrics", "error", "message"),
    [
        ([0.9], TypeError, "metrics must be a mapping"),
        ({"eval_loss": float("nan")}, ValueError, r"metrics\['eval_loss'\] must be a finite number"),
        ({"eval_accuracy": True}, ValueError, r"metrics\['eval_accuracy'\]"),
        ({"": 1.0}, TypeError, "non-empty str"),
    ],
)
def test_model_card_refuses_bad_metrics_before_writing(tmp_path, metrics, error, message):
    with pytest.raises(error, match=message):
        export_for_hub(grown_incrt_model(), None, tmp_path / "export", metrics=metrics)
    assert list(tmp_path.iterdir()) == []

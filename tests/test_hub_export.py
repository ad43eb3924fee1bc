"""Hub export: flat code files that load with `trust_remote_code=True` where `import geoformers` fails."""

import base64
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx2
import pytest
import torch
from huggingface_hub.utils import _http as hf_http

import geoformers  # noqa: F401  (registers the Auto classes)
from geoformers import DDCLIncrtConfig, DDCLIncrtForSequenceClassification, DDLmHCConfig, DDLmHCForCausalLM
from geoformers.modeling.hub_export import MODEL_CARDS, export_for_hub, flatten_module, push_to_hub
from geoformers.tokenization import build_char_tokenizer

# Runs in a fresh interpreter with every `geoformers` import refused, so only the exported files can work.
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
    folder, auto_class, inputs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    model = getattr(transformers, auto_class).from_pretrained(folder, trust_remote_code=True).eval()
    ids = torch.tensor(inputs)
    with torch.no_grad():
        result = {"logits": model(input_ids=ids).logits.tolist(), "class": type(model).__module__}
    if hasattr(model, "generate"):
        result["generated"] = model.generate(ids, max_new_tokens=6, do_sample=False).tolist()
    print(json.dumps(result))
    """
)


def load_without_geoformers(folder: Path, auto_class: str, input_ids: torch.Tensor, tmp_path: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    completed = subprocess.run(
        [sys.executable, "-c", BLOCKED_LOADER, str(folder), auto_class, json.dumps(input_ids.tolist())],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def grown_incrt_model() -> DDCLIncrtForSequenceClassification:
    torch.manual_seed(0)
    config = DDCLIncrtConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_heads=1, head_dim=8, num_prototypes=4,
        max_position_embeddings=16, num_labels=3,
    )
    model = DDCLIncrtForSequenceClassification(config)
    model.grow_head(0)
    model.grow_head(1)
    model.grow_head(1)
    for parameter in model.parameters():  # grown heads start with zero output; make them count
        parameter.data.add_(0.05 * torch.randn_like(parameter))
    return model.eval()


def test_flat_files_hold_no_package_import():
    source = flatten_module(
        "geoformers.modeling.ddcl_incrt", {"geoformers.configuration.ddcl_incrt": ".configuration_ddcl_incrt"}
    )
    compile(source, "modeling_ddcl_incrt.py", "exec")
    assert "geoformers" not in "".join(line for line in source.splitlines() if "import" in line)
    assert "from .configuration_ddcl_incrt import DDCLIncrtConfig" in source
    assert "class GrowableAttention" in source and "class PrototypeBank" in source


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
    assert getattr(model.config, "auto_map", None) is None  # the live model's config is left as it was
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


class FakeHub:
    """The Hub's HTTP API as `huggingface_hub` calls it (create repo, preupload, commit), in memory."""

    def __init__(self):
        self.created, self.files = [], {}

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        url = str(request.url)
        if url.endswith("/api/repos/create"):
            self.created.append(json.loads(request.content)["name"])
            return httpx2.Response(200, json={"url": "https://huggingface.co/user/ddcl-incrt-tiny"})
        if "/preupload/" in url:
            files = json.loads(request.content)["files"]
            modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
            return httpx2.Response(200, json={"files": modes})
        if "/commit/" in url:
            for line in request.content.decode().splitlines():
                entry = json.loads(line)
                if entry["key"] == "file":
                    self.files[entry["value"]["path"]] = base64.b64decode(entry["value"]["content"])
            commit = {"commitUrl": f"https://huggingface.co/user/ddcl-incrt-tiny/commit/{'1' * 40}"}
            return httpx2.Response(200, json={**commit, "commitOid": "1" * 40})
        return httpx2.Response(200, json={})


@pytest.fixture
def fake_hub():
    hub = FakeHub()
    hf_http.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(hub)))
    yield hub
    hf_http.set_client_factory(hf_http.default_client_factory)


def test_push_to_hub_uploads_code_weights_tokenizer_and_card(fake_hub):
    tokenizer = build_char_tokenizer("abcdefg hij")
    push_to_hub(grown_incrt_model(), "user/ddcl-incrt-tiny", tokenizer, token="hf_fake")
    assert fake_hub.created == ["ddcl-incrt-tiny"]
    expected = {"config.json", "model.safetensors", "configuration_ddcl_incrt.py", "modeling_ddcl_incrt.py",
                "tokenizer.json", "tokenizer_config.json"}
    assert expected <= set(fake_hub.files)
    assert json.loads(fake_hub.files["config.json"])["auto_map"]["AutoConfig"].startswith("configuration_")
    if (MODEL_CARDS / "ddcl_incrt.md").is_file():
        assert fake_hub.files["README.md"] == (MODEL_CARDS / "ddcl_incrt.md").read_bytes()


def test_ddl_mhc_loads_anywhere_with_identical_logits_and_tokens(tmp_path):
    torch.manual_seed(0)
    config = DDLmHCConfig(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, hc_streams=4, hc_chart="rtbp",
        residual="delta", stream_expansion="conv",
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

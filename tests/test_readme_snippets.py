"""Every ```python block of README.md runs as written: in README order, in one namespace (as if pasted into
one session), in a scratch folder.

The preamble supplies only what the README leaves to the reader:
* `input.txt` and `new.txt`: a small English text (the README's "e.g. tiny-shakespeare" and "new text");
* `train`: a tokenised classification set (the planted spectral task, 64 rows) for the growth snippet;
* the Hub: huggingface_hub requests go to an in-memory fake (`tests/fake_hub.py`), with a fake token;
and it caps step counts: keyword arguments named in `TINY` with a larger integer literal get the cap
(`max_steps=2000` runs 4 steps), so training snippets run a few steps; nothing else is changed.
"""

import ast
import re
from pathlib import Path

import pytest
import torch
from fake_hub import faked_hub

from geoformers.training.synthetic_tasks import build_spectral_task

README = Path(__file__).resolve().parents[1] / "README.md"
TINY = {"max_steps": 4, "save_steps": 2, "eval_steps": 2, "check_every": 2}
TEXT = (
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and "
    "arrows of outrageous fortune, or to take arms against a sea of troubles and by opposing end them.\n"
) * 12


def python_snippets(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.DOTALL | re.MULTILINE)


class CapSizes(ast.NodeTransformer):
    """`name=<int literal>` -> `name=min(literal, TINY[name])` for the keyword names in TINY."""

    def visit_keyword(self, node: ast.keyword) -> ast.keyword:
        value = node.value
        if node.arg in TINY and isinstance(value, ast.Constant) and type(value.value) is int:
            node.value = ast.copy_location(ast.Constant(min(value.value, TINY[node.arg])), value)
        return node


def tiny(source: str, name: str):
    tree = CapSizes().visit(ast.parse(source, filename=name))
    return compile(ast.fix_missing_locations(tree), name, "exec")


def test_caps_apply_to_the_named_keywords_only():
    namespace = {}
    exec(tiny("a = dict(max_steps=2000, save_steps=1, learning_rate=1000, check_every=100)", "t"), namespace)
    assert namespace["a"] == {"max_steps": 4, "save_steps": 1, "learning_rate": 1000, "check_every": 2}


def test_readme_python_snippets_run_as_written(tmp_path, monkeypatch):
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
    train = build_spectral_task(num_train=64, num_validation=16, seed=0)["train"]
    namespace = {"__name__": "readme", "train": train}
    try:
        with faked_hub():
            for index, snippet in enumerate(snippets, 1):
                first_line = snippet.strip().splitlines()[0]
                try:
                    exec(tiny(snippet, f"README.md python snippet {index}"), namespace)
                except Exception as error:
                    pytest.fail(f"README python snippet {index} ({first_line!r}) failed: {error!r}")
    finally:
        torch.set_num_threads(threads)

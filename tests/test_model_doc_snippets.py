"""The model reference pages (docs/model_doc/): their usage examples run as written, in page order, in one
namespace, in a scratch folder with no network (sizes capped as for the README, `tests/doc_snippets.py`);
their configuration tables list exactly the config class's own fields with its defaults; the model cards
link to them."""

import ast
import dataclasses
import json
import socket
from pathlib import Path

import pytest
import torch
from doc_snippets import LEARNING, TEXT, python_snippets, tiny
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from geoformers import DDCLIncrtConfig, DDLmHCConfig
from geoformers.tokenization import encoding

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"ddl_mhc": DDLmHCConfig, "ddcl_incrt": DDCLIncrtConfig}

pytestmark = pytest.mark.usefixtures("restore_torch_threads")


def page(name: str) -> str:
    return (ROOT / "docs" / "model_doc" / f"{name}.md").read_text(encoding="utf-8")


def run_page(name: str, folder: Path, monkeypatch) -> dict:
    def refuse(*args, **kwargs):
        raise OSError("network access attempted in an offline test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.chdir(folder)
    (folder / "input.txt").write_text(TEXT, encoding="utf-8")
    (folder / "new.txt").write_text(TEXT + "To be é.\n", encoding="utf-8")  # 'é' is not in input.txt
    torch.manual_seed(0)
    torch.set_num_threads(1)
    namespace = {"__name__": f"model_doc_{name}"}
    snippets = python_snippets(page(name))
    assert snippets, f"docs/model_doc/{name}.md has no ```python block"
    for index, snippet in enumerate(snippets, 1):
        try:
            exec(tiny(snippet, f"docs/model_doc/{name}.md python snippet {index}"), namespace)
        except Exception as error:
            pytest.fail(f"docs/model_doc/{name}.md python snippet {index} failed: {error!r}")
    return namespace


def test_the_ddl_mhc_page_runs(tmp_path, monkeypatch, capsys):
    logger = logging.get_logger(f"transformers.{encoding.__name__}")
    with CaptureLogger(logger) as captured:
        namespace = run_page("ddl_mhc", tmp_path, monkeypatch)
    printed = capsys.readouterr().out.splitlines()
    config = namespace["config"]
    prompt_length = namespace["input_ids"].shape[1]
    assert printed[0] == f"torch.Size([1, {prompt_length}, {config.vocab_size}])"
    assert printed[1] == f"torch.Size([1, {prompt_length}, 4, 128])"
    assert printed[3] == "True"  # the upcycled Llama computes Llama's logits
    # the LoRA example reported the one character of new.txt the tokenizer does not know
    assert "1 characters of new.txt (1 distinct)" in captured.out and "'é' x1" in captured.out
    assert "eval_perplexity" in printed[-1]
    assert (tmp_path / "lora_run" / "final" / "adapter_config.json").is_file()


def test_the_ddcl_incrt_page_runs(tmp_path, monkeypatch, capsys):
    namespace = run_page("ddcl_incrt", tmp_path, monkeypatch)
    printed = capsys.readouterr().out.splitlines()
    assert printed[:2] == ["True", "[2, 1]"]  # growth preserved the function
    assert printed[4] == "[2, 1]"  # reloaded at its grown size
    # the Trainer example learned: heads grew and the validation accuracy is well above chance (0.5)
    history = json.loads((tmp_path / "incrt_run" / "growth_history.json").read_text())
    assert history["growth_started_at_step"] == LEARNING["start_step"]
    heads, accuracy = namespace["encoder"].config.num_heads, namespace["accuracy"]
    assert heads == history["num_heads"] and heads[0] > 1
    assert accuracy > 0.65 and printed[-1] == f"heads {heads}, validation accuracy {accuracy:.3f}"


def configuration_table(markdown: str, class_name: str) -> dict[str, str]:
    """parameter -> default cell of the table under `## <class_name>`."""
    section = markdown.split(f"## {class_name}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| `")]
    return {cells[0].strip("|` "): cells[1].strip("` ") for cells in rows}


@pytest.mark.parametrize(("name", "config_class"), PAGES.items())
def test_the_configuration_table_lists_every_field_with_its_default(name, config_class):
    table = configuration_table(page(name), config_class.__name__)
    defaults = {field.name: field.default for field in dataclasses.fields(config_class)}
    assert list(table) == list(config_class.__annotations__)  # the class's own fields, in its order
    for parameter, default in table.items():
        assert ast.literal_eval(default) == defaults[parameter], parameter
        assert type(ast.literal_eval(default)) is type(defaults[parameter]), parameter


@pytest.mark.parametrize("name", PAGES)
def test_the_model_card_links_to_its_reference_page(name):
    card = (ROOT / "model_cards" / f"{name}.md").read_text(encoding="utf-8")
    assert f"docs/model_doc/{name}.md" in card

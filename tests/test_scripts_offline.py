"""Every script that loads a canonical dataset (SST-2 from GLUE, tiny-shakespeare) stops at once when the
Hub cannot serve it, with one line naming the dataset and the flag that takes a local copy
(docs/experiments.md, 'Data'). The Hub is made unreachable by pointing its endpoint at a closed local port;
tests/test_train_causal_lm_script.py runs one script under HF_HUB_OFFLINE=1 with an empty cache."""

import argparse

import pytest
from script_modules import load_script

from geoformers.training import data

pytestmark = pytest.mark.usefixtures("restore_torch_threads")


@pytest.fixture(autouse=True)
def unreachable_hub(monkeypatch):
    monkeypatch.setattr(data.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(data.constants, "HF_HUB_OFFLINE", False)


def exit_message(call) -> str:
    with pytest.raises(SystemExit) as error:
        call()
    message = str(error.value.code)
    assert message.startswith("error: cannot load the Hub dataset") and "\n" not in message
    return message


def test_tiny_shakespeare_scripts_name_data():
    """bench_causal_lm.py, exp_stream_scaling.py and upcycle_llama.py read it through `load_corpus`."""
    from harness.causal_lm import load_corpus

    message = exit_message(lambda: load_corpus(None))
    assert "'karpathy/tiny_shakespeare'" in message and "pass a local copy with --data FILE" in message


def test_sst2_scripts_name_data_dir():
    """exp_sst2.py and exp_grown_vs_swept.py read it through `harness.sst2.load_data`."""
    from harness.sst2 import load_data

    for call in (
        lambda: load_data(argparse.Namespace(data_dir=None)),
        lambda: load_script("exp_pruning_safety.py").load_data(argparse.Namespace(data_dir=None), None),
    ):
        message = exit_message(call)
        assert "'nyu-mll/glue'" in message and "pass a local copy with --data_dir DIR" in message


def test_train_causal_lm_names_train_file(tmp_path):
    script = load_script("train_causal_lm.py")
    message = exit_message(lambda: script.main(["--output_dir", str(tmp_path), "--threads", "1"]))
    assert "'karpathy/tiny_shakespeare'" in message and "--train_file" in message
    assert "unreachable" in message and "HF_HUB_OFFLINE=1" in message

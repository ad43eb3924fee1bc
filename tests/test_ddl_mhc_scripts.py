"""The DDL-mHC command-line scripts (docs/experiments.md, 'train_causal_lm.py'): training saves an
Auto-loadable model and tokenizer with every config field settable from the command line; the benchmark writes
its JSON report."""

import json
import subprocess
import sys

import pytest
import torch
from script_modules import SCRIPTS, load_script
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser

import geoformers
from geoformers.tokenization import build_char_tokenizer

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 40


def test_train_script_saves_an_auto_loadable_model_and_tokenizer(tmp_path, monkeypatch, capsys):
    data = tmp_path / "corpus.txt"
    data.write_text(TEXT, encoding="utf-8")
    output = tmp_path / "model"
    argv = [
        *("--data", str(data), "--output_dir", str(output), "--max_steps", "4", "--eval_steps", "2"),
        *(
            "--eval_batches",
            "1",
            "--per_device_train_batch_size",
            "2",
            "--block_size",
            "16",
            "--sample_tokens",
            "8",
        ),
        *("--hidden_size", "32", "--intermediate_size", "48", "--num_hidden_layers", "1"),
        *("--num_attention_heads", "2", "--hc_streams", "2", "--hc_chart", "kromhc"),
        *("--stream_expansion", "conv", "--hc_dynamic", "false", "--delta_beta_init", "0.5"),
        *("--threads", "1"),
    ]
    monkeypatch.setattr(sys, "argv", ["train_causal_lm.py", *argv])
    threads = torch.get_num_threads()
    try:
        load_script("train_causal_lm.py").main()
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert "--- sample ---" in printed and f"wrote {output / 'training_history.json'}" in printed

    model = AutoModelForCausalLM.from_pretrained(output)
    tokenizer = AutoTokenizer.from_pretrained(output)
    assert isinstance(model, geoformers.DDLmHCForCausalLM)
    config = model.config
    assert (config.hc_streams, config.hc_chart, config.stream_expansion) == (2, "kromhc", "conv")
    assert config.hc_dynamic is False and config.delta_beta_init == 0.5
    assert config.vocab_size == len(tokenizer) == 3 + len(set(TEXT))
    assert tokenizer.decode(tokenizer("Speak, speak.")["input_ids"]) == "Speak, speak."
    report = json.loads((output / "training_history.json").read_text())
    assert [record["step"] for record in report["history"]] == [2, 4]
    assert report["settings"]["max_steps"] == 4 and report["settings"]["data"] == str(data)
    assert report["command"].startswith("python scripts/train_causal_lm.py")
    assert report["environment"]["threads"] == 1
    with torch.no_grad():
        ids = torch.tensor([tokenizer("Before we")["input_ids"]])
        assert torch.isfinite(model(ids).logits).all()


def test_train_script_flags_cover_every_config_field_and_report_bad_values():
    script = load_script("train_causal_lm.py")
    parser = HfArgumentParser(script.ConfigArguments)
    flags = {action.dest for action in parser._actions}
    declared = set(geoformers.DDLmHCConfig.__annotations__) - set(script.TOKENIZER_FIELDS)
    assert declared <= flags
    tokenizer = build_char_tokenizer(TEXT)
    args = parser.parse_args(["--hc_streams", "2", "--rope_parameters", '{"rope_type": "default"}'])
    config = script.config_from_args(args, tokenizer, block_size=64)
    assert config.hc_streams == 2 and config.vocab_size == len(tokenizer)
    with pytest.raises(TypeError, match="hc_chart"):
        script.config_from_args(parser.parse_args(["--hc_chart", "birkhoff"]), tokenizer, block_size=64)


@pytest.mark.slow
def test_benchmark_writes_its_report(tmp_path, shared_data):
    output = tmp_path / "causal_lm.json"  # the default mode's name in --output_dir
    data = shared_data / "tinyshakespeare" / "input.txt"
    command = [
        *(sys.executable, str(SCRIPTS / "bench_causal_lm.py"), "--threads", "1", "--data", str(data)),
        *("--max_steps", "2", "--eval_batches", "1", "--gen_tokens", "4", "--gen_reps", "1"),
        *("--output_dir", str(tmp_path)),
        *("--variants", "llama (transformers)", "ddl-mhc n=1 add", "ddl-mhc n=4 delta rtbp"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(output.read_text())
    rows = {row["model"]: row for row in report["results"]}
    assert set(rows) == {"llama (transformers)", "ddl-mhc n=1 add", "ddl-mhc n=4 delta rtbp"}
    assert rows["llama (transformers)"]["train_throughput_ratio"] == 1.0
    # the n = 1 "add" ablation is Llama: same parameter count, same validation loss after the same steps
    assert rows["ddl-mhc n=1 add"]["parameters"] == rows["llama (transformers)"]["parameters"]
    llama_loss = rows["llama (transformers)"]["val_loss"]
    assert rows["ddl-mhc n=1 add"]["val_loss"] == pytest.approx(llama_loss, abs=1e-4)
    assert "| ddl-mhc n=4 delta rtbp |" in report["markdown"]

"""Smoke test of `scripts/finetune_lora.py` (docs/experiments.md, 'finetune_lora.py'): a tiny saved DDL-mHC
checkpoint with its char tokenizer is adapted to a new text; the reported trainable-parameter count matches a
hand count, the validation loss falls, and the saved adapter and merged model reload with the same logits."""

import json
import sys
from pathlib import Path

import pytest
import torch
from peft import AutoPeftModelForCausalLM
from script_modules import load_script
from transformers import AutoModelForCausalLM

import geoformers
from geoformers.tokenization import build_char_tokenizer

ORIGINAL_TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
NEW_TEXT = "All:\nwe proceed, we speak, hear me.\nFirst:\nSpeak further, Citizen.\n" * 30  # same characters
HIDDEN, LAYERS, STREAMS, RANK = 32, 2, 4, 4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A DDL-mHC model (n = 4, delta, rtbp, dynamic maps) and its char tokenizer, saved as train_causal_lm
    saves them."""
    folder = tmp_path_factory.mktemp("checkpoint")
    tokenizer = build_char_tokenizer(ORIGINAL_TEXT)
    torch.manual_seed(0)
    config = geoformers.DDLmHCConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=48,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        max_position_embeddings=32,
        hc_streams=STREAMS,
        residual="delta",
        hc_chart="rtbp",
        hc_dynamic=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    geoformers.DDLmHCForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run_script(monkeypatch, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", ["finetune_lora.py", *argv])
    threads = torch.get_num_threads()
    try:
        load_script("finetune_lora.py").main()
    finally:
        torch.set_num_threads(threads)


def write_text(folder: Path, text: str) -> Path:
    path = folder / "new.txt"
    path.write_text(text, encoding="utf-8")
    return path


def smoke_arguments(checkpoint: Path, data: Path, output: Path) -> list[str]:
    return [
        *("--checkpoint", str(checkpoint), "--data", str(data), "--output_dir", str(output)),
        *(
            "--max_steps",
            "30",
            "--per_device_train_batch_size",
            "4",
            "--block_size",
            "16",
            "--eval_batches",
            "2",
        ),
        *("--eval_steps", "15", "--learning_rate", "1e-2", "--warmup_steps", "2", "--lora_r", str(RANK)),
        *("--lora_alpha", "8", "--threads", "1"),
    ]


def test_lora_script_reports_counts_and_losses_and_saves_adapter_and_merged_model(
    checkpoint, tmp_path, monkeypatch, capsys
):
    output = tmp_path / "lora"
    weights_before = (checkpoint / "model.safetensors").read_bytes()
    run_script(monkeypatch, *smoke_arguments(checkpoint, write_text(tmp_path, NEW_TEXT), output), "--merge")
    printed = capsys.readouterr().out
    assert "trainable parameters:" in printed and "validation loss:" in printed

    report = json.loads((output / "lora_report.json").read_text())
    assert report["command"].startswith("python scripts/finetune_lora.py")
    assert report["settings"]["lora_r"] == RANK and report["settings"]["eval_steps"] == 15
    assert report["environment"]["threads"] == 1
    # r (in + out) per wrapped nn.Linear, by hand: q/k/v/o 32 -> 32; per connection maps_proj n d = 128 ->
    # n + (n-1)^2 + 1 = 14 (H_pre, rtbp H_res, beta) and value_proj 32 -> n = 4; two connections per layer.
    maps_out = STREAMS + (STREAMS - 1) ** 2 + 1
    per_layer = 4 * RANK * 2 * HIDDEN + 2 * (RANK * (STREAMS * HIDDEN + maps_out) + RANK * (HIDDEN + STREAMS))
    base = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    assert report["trainable_parameters"] == LAYERS * per_layer
    assert report["total_parameters"] == base.num_parameters() + LAYERS * per_layer
    assert report["trainable_percent"] == pytest.approx(100 * LAYERS * per_layer / report["total_parameters"])
    assert report["lora_layers"] == {name: 2 * LAYERS for name in ("maps_proj", "value_proj")} | {
        name: LAYERS for name in ("q_proj", "k_proj", "v_proj", "o_proj")
    }
    assert report["unknown_tokens"] == 0 and [record["step"] for record in report["history"]] == [15, 30]
    assert report["val_loss_after"] < report["val_loss_before"] - 0.1
    assert report["merged_val_loss"] == pytest.approx(report["val_loss_after"], abs=1e-5)

    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {
        path.name for path in output.iterdir()
    }
    assert (checkpoint / "model.safetensors").read_bytes() == weights_before  # the base is left untouched
    adapted = AutoPeftModelForCausalLM.from_pretrained(output).eval()  # finds the base by its saved path
    merged = AutoModelForCausalLM.from_pretrained(output / "merged").eval()
    ids = torch.tensor([[0, 5, 9, 12, 7, 3, 20, 8]])
    with torch.no_grad():
        adapted_logits, merged_logits = adapted(input_ids=ids).logits, merged(input_ids=ids).logits
        base_logits = base(input_ids=ids).logits
    assert (adapted_logits - base_logits).abs().max() > 1e-2
    torch.testing.assert_close(merged_logits, adapted_logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("extra", "text", "error", "match"),
    [
        (["--target_modules", "q_proj", "query"], NEW_TEXT, ValueError, "--target_modules"),
        (["--block_size", "64"], NEW_TEXT, ValueError, "--block_size"),
        ([], NEW_TEXT[:40], ValueError, "--block_size"),
        ([], NEW_TEXT + "Zounds! " * 40, ValueError, r"--max_unk_fraction.*'Z'"),
        (["--lora_r", "0"], NEW_TEXT, ValueError, "--lora_r"),
        (["--modules_to_save", "head"], NEW_TEXT, ValueError, "--modules_to_save"),
    ],
    ids=["unknown-target", "block-too-long", "text-too-short", "unknown-chars", "rank-0", "unknown-module"],
)
def test_lora_script_rejects_bad_arguments_by_flag(
    checkpoint, tmp_path, monkeypatch, extra, text, error, match
):
    arguments = smoke_arguments(checkpoint, write_text(tmp_path, text), tmp_path / "lora")
    with pytest.raises(error, match=match):
        run_script(monkeypatch, *arguments, *extra)
    assert not (tmp_path / "lora").exists()


def test_lora_script_rejects_missing_or_foreign_checkpoints(tmp_path, monkeypatch):
    data = write_text(tmp_path, NEW_TEXT)
    with pytest.raises(FileNotFoundError, match="--checkpoint"):
        run_script(monkeypatch, *smoke_arguments(tmp_path / "missing", data, tmp_path / "lora"))
    encoder = tmp_path / "encoder"
    encoder_config = geoformers.DDCLIncrtConfig(vocab_size=40, hidden_size=16, head_dim=8)
    geoformers.DDCLIncrtModel(encoder_config).save_pretrained(encoder)
    with pytest.raises(ValueError, match="'ddcl_incrt'"):
        run_script(monkeypatch, *smoke_arguments(encoder, data, tmp_path / "lora"))

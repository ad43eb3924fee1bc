"""scripts/train_causal_lm.py (docs/experiments.md, 'train_causal_lm.py'): run_clm's shape with the stock
Trainer. A tiny run saves an Auto-loadable model whose reported validation loss matches an independent fp64
computation; a resumed run ends exactly where an uninterrupted one does; two gloo processes (`torchrun`,
`accelerate launch`, `torchrun` with the FSDP2 flags) equal one process at twice the batch; streaming; bad
flags fail before anything loads; offline it fails in one line naming the dataset and `--train_file`."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from script_modules import SCRIPTS, load_script
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser

import geoformers
from geoformers.tokenization import build_char_tokenizer

pytestmark = pytest.mark.usefixtures("restore_torch_threads")

TRAIN_TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 30
VALIDATION_TEXT = "MENENIUS:\nWhat work's, my countrymen, in hand? where go you\nWith bats and clubs?\n" * 3
BLOCK = 16
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
TINY = [
    *("--hidden_size", "32", "--intermediate_size", "48", "--num_hidden_layers", "1"),
    *("--num_attention_heads", "2", "--block_size", str(BLOCK), "--threads", "1", "--use_cpu"),
    *("--disable_tqdm", "true", "--logging_steps", "1", "--sample_tokens", "0"),
]


@pytest.fixture
def texts(tmp_path):
    train, validation = tmp_path / "train.txt", tmp_path / "validation.txt"
    train.write_text(TRAIN_TEXT, encoding="utf-8")
    validation.write_text(VALIDATION_TEXT, encoding="utf-8")
    return train, validation


def run(argv: list[str]) -> dict:
    return load_script("train_causal_lm.py").main(argv)


def logged(output_dir) -> dict:
    return json.loads((output_dir / "training_history.json").read_text())


def losses(report: dict) -> list[float]:
    return [entry["loss"] for entry in report["log_history"] if "loss" in entry]


def test_tiny_run_saves_an_auto_loadable_model_and_reports_the_validation_loss(texts, tmp_path, capsys):
    train, validation = texts
    output = tmp_path / "model"
    argv = [
        *("--train_file", str(train), "--validation_file", str(validation), "--output_dir", str(output)),
        *TINY,
        *("--max_steps", "6", "--eval_steps", "3", "--save_steps", "3", "--sample_tokens", "8"),
        *("--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "5"),
        *("--hc_streams", "2", "--hc_chart", "kromhc", "--stream_expansion", "conv"),
        *("--hc_dynamic", "false", "--delta_beta_init", "0.5"),
    ]
    metrics = run(argv)
    assert "--- sample ---" in capsys.readouterr().out
    assert sorted(path.name for path in output.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]

    model = AutoModelForCausalLM.from_pretrained(output)
    tokenizer = AutoTokenizer.from_pretrained(output)
    assert isinstance(model, geoformers.DDLmHCForCausalLM)
    config = model.config
    assert (config.hc_streams, config.hc_chart, config.stream_expansion) == (2, "kromhc", "conv")
    assert config.hc_dynamic is False and config.delta_beta_init == 0.5
    assert config.vocab_size == len(tokenizer) == 3 + len(set(TRAIN_TEXT + VALIDATION_TEXT))

    # independent reference: the validation text packed by hand, fp64 cross-entropy of the saved model
    ids = tokenizer(VALIDATION_TEXT, add_special_tokens=False)["input_ids"]
    blocks = torch.tensor(ids[: len(ids) // BLOCK * BLOCK]).view(-1, BLOCK)
    model.eval()
    with torch.no_grad():
        log_probs = torch.log_softmax(model(input_ids=blocks).logits[:, :-1].double(), dim=-1)
    nll = -log_probs.gather(-1, blocks[:, 1:, None]).mean()
    assert metrics["eval_loss"] == pytest.approx(float(nll), rel=1e-5)
    assert metrics["eval_perplexity"] == pytest.approx(float(nll.exp()), rel=1e-5)

    report = logged(output)
    assert len(losses(report)) == 6 and all(0 < loss < 10 for loss in losses(report))
    assert [entry["step"] for entry in report["log_history"] if "eval_loss" in entry] == [3, 6]
    assert report["settings"]["train_file"] == str(train) and report["settings"]["hc_chart"] == "kromhc"
    assert report["settings"]["max_steps"] == 6 and report["settings"]["world_size"] == 1
    assert report["command"].startswith("python scripts/train_causal_lm.py --train_file")


def test_resumed_run_ends_where_the_uninterrupted_one_does(texts, tmp_path):
    """Killed after checkpoint-4 of 8: `--resume_from_checkpoint true` restores model, optimizer, schedule,
    data order and RNG, so the losses of steps 5-8 and the final weights are the uninterrupted run's."""
    train, _ = texts
    common = [*("--train_file", str(train), "--max_steps", "8", "--save_steps", "4"), *TINY]
    common += ["--per_device_train_batch_size", "4", "--eval_strategy", "no", "--hc_streams", "2"]
    run([*common, "--output_dir", str(tmp_path / "whole")])
    interrupted = tmp_path / "interrupted"
    interrupted.mkdir()
    os.rename(tmp_path / "whole" / "checkpoint-4", interrupted / "checkpoint-4")
    run([*common, "--output_dir", str(interrupted), "--resume_from_checkpoint", "true"])

    whole, resumed = logged(tmp_path / "whole"), logged(interrupted)
    assert losses(whole)[4:] == pytest.approx(losses(resumed)[-4:], rel=1e-6)
    first, second = (AutoModelForCausalLM.from_pretrained(path) for path in (tmp_path / "whole", interrupted))
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)


ACCELERATE = os.path.join(os.path.dirname(sys.executable), "accelerate")
FSDP2 = ["--fsdp", "full_shard auto_wrap", "--fsdp_config", '{"version": 2}']
LAUNCHERS = {
    "torchrun": ([TORCHRUN, "--standalone", "--nproc_per_node", "2"], []),
    # accelerate's distributed launcher; `--use_cpu` (the script's flag) keeps the Trainer on CPU and gloo
    "accelerate launch": (
        [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"],
        [],
    ),
    # FSDP2 by configuration: on CPU accelerate wraps the model in DDP instead (docs/multi_process.md)
    "torchrun --fsdp": ([TORCHRUN, "--standalone", "--nproc_per_node", "2"], FSDP2),
}


@pytest.mark.slow  # two processes start torch and transformers: about 16 s each
@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_two_gloo_processes_equal_one_process_at_twice_the_batch(texts, tmp_path, launcher):
    """Two processes (gloo, `--use_cpu`) under `torchrun`, `accelerate launch`, and `torchrun` with the FSDP2
    flags: each process takes its share of every batch, so batch 2 x 4 trains exactly as batch 8 in one
    process."""
    train, _ = texts
    prefix, flags = LAUNCHERS[launcher]
    assert os.path.isfile(prefix[0]), f"{prefix[0]} is missing beside {sys.executable}"
    common = [*("--train_file", str(train), "--max_steps", "4", "--eval_strategy", "no"), *TINY]
    common += ["--save_strategy", "no", "--hc_streams", "2", "--seed", "3"]
    command = [*prefix, str(SCRIPTS / "train_causal_lm.py"), *common, *flags]
    command += ["--per_device_train_batch_size", "4", "--output_dir", str(tmp_path / "two")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-4000:]
    run([*common, "--per_device_train_batch_size", "8", "--output_dir", str(tmp_path / "one")])

    two, one = logged(tmp_path / "two"), logged(tmp_path / "one")
    assert two["settings"]["world_size"] == 2 and one["settings"]["world_size"] == 1
    assert losses(two) == pytest.approx(losses(one), rel=1e-5)
    norms = [
        [entry["grad_norm"] for entry in report["log_history"] if "loss" in entry] for report in (two, one)
    ]
    assert norms[0] == pytest.approx(norms[1], rel=1e-4)


def test_streaming_needs_a_tokenizer_and_then_trains_max_steps(texts, tmp_path, capsys):
    train, _ = texts
    common = [
        *("--train_file", str(train), "--streaming", "--max_steps", "3", "--eval_strategy", "no"),
        *TINY,
    ]
    common += ["--per_device_train_batch_size", "2", "--save_strategy", "no"]
    with pytest.raises(SystemExit):
        run([*common, "--output_dir", str(tmp_path / "none")])
    assert "--streaming needs --tokenizer_name" in capsys.readouterr().err
    build_char_tokenizer(TRAIN_TEXT).save_pretrained(tmp_path / "tokenizer")
    run([*common, "--tokenizer_name", str(tmp_path / "tokenizer"), "--output_dir", str(tmp_path / "out")])
    report = logged(tmp_path / "out")
    assert len(losses(report)) == 3 and report["log_history"][-1]["step"] == 3


@pytest.mark.parametrize(
    "flags",
    [
        ["--learning_rate", "-1"],
        ["--threads", "-2"],
        ["--block_size", "1"],
        ["--per_device_train_batch_size", "0"],
        ["--adam_beta2", "1.5"],
        ["--temperature", "0"],
        ["--train_file", "no/such/file.txt"],
    ],
)
def test_bad_flags_fail_naming_the_flag_before_anything_loads(flags, tmp_path, capsys):
    """A dataset that does not exist shows that nothing was loaded before the check."""
    argv = ["--dataset_name", "nobody/no-such-dataset", "--output_dir", str(tmp_path), *flags]
    with pytest.raises(SystemExit) as error:
        run(argv)
    assert error.value.code == 2
    assert flags[0] in capsys.readouterr().err.strip().splitlines()[-1]


def test_config_flags_cover_every_config_field_and_report_bad_values():
    script = load_script("train_causal_lm.py")
    parser = HfArgumentParser(script.ConfigArguments)
    flags = {action.dest for action in parser._actions}
    declared = set(geoformers.DDLmHCConfig.__annotations__) - set(script.NOT_FLAGS)
    assert declared <= flags
    tokenizer = build_char_tokenizer(TRAIN_TEXT)
    args = parser.parse_args(["--hc_streams", "2", "--rope_parameters", '{"rope_type": "default"}'])
    config = script.config_from_args(args, tokenizer, block_size=64)
    assert config.hc_streams == 2 and config.vocab_size == len(tokenizer)
    with pytest.raises(TypeError, match="hc_chart"):
        script.config_from_args(parser.parse_args(["--hc_chart", "birkhoff"]), tokenizer, block_size=64)


def test_offline_without_the_data_fails_in_one_line_naming_the_dataset_and_the_flag(tmp_path):
    """HF_HUB_OFFLINE=1 and an empty Hugging Face cache: no retries, exit status 1, no traceback."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(SCRIPTS / "train_causal_lm.py"), "--output_dir", str(tmp_path / "out")]
    start = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert completed.returncode == 1 and time.perf_counter() - start < 60
    assert "Traceback" not in completed.stderr
    last = completed.stderr.strip().splitlines()[-1]
    assert "'karpathy/tiny_shakespeare'" in last and "--train_file" in last and "offline" in last


def test_activation_checkpointing_and_tensorboard_reach_the_trainer(texts, tmp_path):
    """`--activation_checkpointing true` (transformers 5's name for `--gradient_checkpointing`) recomputes
    the same losses; `--report_to tensorboard` writes every logged loss to the event file (under
    `--output_dir`/runs)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train, _ = texts
    common = [*("--train_file", str(train), "--max_steps", "4", "--eval_strategy", "no"), *TINY]
    common += ["--per_device_train_batch_size", "4", "--save_strategy", "no", "--hc_streams", "2"]
    run([*common, "--output_dir", str(tmp_path / "plain")])
    run([*common, "--output_dir", str(tmp_path / "checkpointed"), "--activation_checkpointing", "true"])
    run([*common, "--output_dir", str(tmp_path / "reported"), "--report_to", "tensorboard"])
    plain = losses(logged(tmp_path / "plain"))
    assert losses(logged(tmp_path / "checkpointed")) == pytest.approx(plain, rel=1e-5)
    (events,) = {path.parent for path in (tmp_path / "reported").rglob("events.out.tfevents.*")}
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    scalars = [event.value for event in accumulator.Scalars("train/loss")]
    assert scalars == pytest.approx(plain, rel=1e-6)


def test_model_from_a_saved_folder_or_converted_from_a_llama(texts, tmp_path, capsys):
    """`--model_name_or_path`: a saved DDL-mHC folder trains on (config flags may not change it); a Llama
    folder is converted with the config flags given as overrides: at learning rate 0 the saved model is the
    exact add conversion, with Llama's logits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    train, _ = texts
    common = [*("--train_file", str(train), "--max_steps", "2", "--eval_strategy", "no"), *TINY]
    common += ["--per_device_train_batch_size", "2", "--save_strategy", "no"]
    run([*common, "--output_dir", str(tmp_path / "first"), "--hc_streams", "2"])
    run([*common, "--output_dir", str(tmp_path / "again"), "--model_name_or_path", str(tmp_path / "first")])
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "again").config.hc_streams == 2
    with pytest.raises(ValueError, match=r"\['hc_streams'\] cannot change the saved DDL-mHC model"):
        run([*common, "--output_dir", str(tmp_path / "x"), "--model_name_or_path", str(tmp_path / "first"),
             "--hc_streams", "4"])  # fmt: skip

    tokenizer = build_char_tokenizer(TRAIN_TEXT)
    torch.manual_seed(0)
    llama_config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=2, max_position_embeddings=BLOCK, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    llama = LlamaForCausalLM(llama_config).eval()
    llama.save_pretrained(tmp_path / "llama")
    tokenizer.save_pretrained(tmp_path / "llama")
    converted_dir, llama_dir = str(tmp_path / "converted"), str(tmp_path / "llama")
    run([*common, "--output_dir", converted_dir, "--model_name_or_path", llama_dir,
         "--hc_streams", "4", "--residual", "add", "--learning_rate", "0"])  # fmt: skip
    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "converted").eval()
    assert isinstance(converted, geoformers.DDLmHCForCausalLM) and converted.config.hc_streams == 4
    ids = torch.tensor([tokenizer("Speak, speak.")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, llama(ids).logits, rtol=0, atol=1e-5)


def test_characters_the_tokenizer_does_not_know_are_reported(texts, tmp_path, caplog):
    """A tokenizer built on the training text meets new characters in the validation file: the run names
    them with their counts, as many as the <unk> tokens."""
    train, validation = texts
    build_char_tokenizer(TRAIN_TEXT).save_pretrained(tmp_path / "tokenizer")
    argv = [*("--train_file", str(train), "--validation_file", str(validation), "--max_steps", "1"), *TINY]
    argv += ["--tokenizer_name", str(tmp_path / "tokenizer"), "--output_dir", str(tmp_path / "out")]
    argv += ["--per_device_train_batch_size", "2", "--save_strategy", "no", "--eval_strategy", "no"]
    with caplog.at_level("WARNING", logger="transformers.train_causal_lm"):
        run(argv)
    unknown = {c: VALIDATION_TEXT.count(c) for c in set(VALIDATION_TEXT) - set(TRAIN_TEXT)}
    reports = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert len(reports) == 1 and "validation split" in reports[0]
    assert f"{sum(unknown.values()):,} of the {len(VALIDATION_TEXT):,} tokens" in reports[0]
    top = max(unknown, key=unknown.get)
    assert f"{top!r} x{unknown[top]:,}" in reports[0]

"""The scripts' one flag policy (docs/experiments.md, 'Flags'): every script takes `--threads` and parses
with `harness.flag_checks.CheckedParser`, which refuses a bad value naming its flag (argparse's exit status
2) before anything is loaded."""

import sys

import pytest
from script_modules import SCRIPTS, load_script

from harness.flag_checks import CheckedParser, check_flags

pytestmark = pytest.mark.usefixtures("restore_torch_threads")

ALL_SCRIPTS = sorted(path.name for path in SCRIPTS.glob("*.py"))


def run_main(name: str, argv: list[str], monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", [name, *argv])
    module = load_script(name)
    if module.main.__code__.co_argcount:
        module.main(argv)
    else:
        module.main()


@pytest.mark.parametrize("name", ALL_SCRIPTS)
def test_every_script_takes_threads(name, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_main(name, ["--help"], monkeypatch)
    assert exit_.value.code == 0 and "--threads" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("name", "argv", "flag"),
    [
        ("exp_upcycle_pretrained.py", ["--learning_rate", "-1"], "--learning_rate"),
        ("convert_llama.py", ["--output_dir", "out", "--threads", "-1"], "--threads"),
        ("bench_save.py", ["--threads", "-3"], "--threads"),
        ("bench_decode.py", ["--widths", "100"], "--widths"),
        ("bench_decode.py", ["--reps", "0"], "--reps"),
        ("bench_decode.py", ["--host_crossing", "--host_streams", "1"], "--host_streams"),
        ("bench_decode.py", ["--host_crossing", "--host_rows", "0"], "--host_rows"),
        ("bench_causal_lm.py", ["--weight_decay", "-0.1"], "--weight_decay"),
        ("exp_stream_scaling.py", ["--max_grad_norm", "-1"], "--max_grad_norm"),
        ("upcycle_llama.py", ["--per_device_train_batch_size", "0"], "--per_device_train_batch_size"),
        ("grow_demo.py", ["--adam_beta2", "1"], "--adam_beta2"),
        ("finetune_lora.py", ["--checkpoint", "c", "--data", "d", "--block_size", "1"], "--block_size"),
    ],
)
def test_bad_values_exit_naming_the_flag_before_anything_loads(name, argv, flag, monkeypatch, capsys):
    """The checkpoint / data paths in these argv do not exist: the flag check comes first."""
    with pytest.raises(SystemExit) as exit_:
        run_main(name, argv, monkeypatch)
    assert exit_.value.code == 2
    assert flag in capsys.readouterr().err.strip().splitlines()[-1]


def test_check_flags_accepts_the_edges_and_names_the_flag():
    check_flags(type("Args", (), {"learning_rate": 0.0, "adam_beta2": 0.0, "max_steps": -1, "threads": 0}))
    for flag, value in (("max_steps", 0), ("adam_beta1", 1.0), ("threads", 1.5), ("eval_batches", True)):
        with pytest.raises((ValueError, TypeError), match=f"--{flag}"):
            check_flags(type("Args", (), {flag: value}))
    parser = CheckedParser(())
    with pytest.raises(SystemExit):
        parser.checked(check_flags, type("Args", (), {"learning_rate": float("nan")}))

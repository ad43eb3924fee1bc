"""The main job and the synthetic, CoV-2 and non-stationary experiments (docs/experiments.md): tiny-budget
runs of `scripts/grow_demo.py`, `exp_synthetic.py`, `exp_cov2.py`, `exp_nonstationary.py` write what they
claim, with numbers checked against independent recomputations; the shared helpers of `scripts/harness`
against hand computations and float64 references; bad arguments."""

import argparse
import ast
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from growth_worker import sign_rows, signed_row_indices
from script_modules import load_script
from transformers import HfArgumentParser

import geoformers  # noqa: F401  (registers the Auto classes)
from geoformers.model_io.remote_code import remote_code_files
from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification
from geoformers.training.checkpoints import write_json_atomically
from geoformers.training.synthetic_tasks import (
    build_cov2_variant_task,
    build_nonstationary_stream,
    build_spectral_task,
    task_spec,
)

from harness import recipe
from harness.analysis import (
    grow_order,
    head_count_law,
    heads_at_factor,
    spectrum_head_count_law,
    stop_summary,
    temperature_split,
)
from harness.flags import RecipeArguments, build_model, experiment_parser
from harness.lm_trainer import LMArguments
from harness.printing import describe_event
from harness.probes import PrototypeProbe, evaluate_accuracy, gate_spectrum, rows_as_batch
from harness.recipe import recent_stream_rows, run_growth_training
from harness.results import REPO_ROOT, markdown_table, write_results
from harness.threads import set_threads

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY_MODEL = [
    "--hidden_size",
    "16",
    "--head_dim",
    "4",
    "--num_prototypes",
    "4",
    "--gate_batch_size",
    "16",
    "--per_device_train_batch_size",
    "16",
    "--gate_num_tokens",
    "128",
]


pytestmark = pytest.mark.usefixtures("restore_torch_threads")


def tiny_args(**overrides) -> argparse.Namespace:
    args = experiment_parser().parse_args(TINY_MODEL)
    for name, value in overrides.items():
        setattr(args, name, value)
    return args


# --------------------------------------------------------------------------------------------- the main job


def test_grow_demo_saves_a_checkpoint_that_reloads_with_the_grown_heads(tmp_path, capsys):
    grow_demo = load_script("grow_demo.py")
    argv = TINY_MODEL + [
        "--max_steps",
        "24",
        "--pre_growth_steps",
        "8",
        "--num_train",
        "128",
        "--num_validation",
        "64",
        "--eval_steps",
        "12",
        "--disable_tqdm",
        "true",
        "--output_dir",
        str(tmp_path),
    ]
    summary = grow_demo.main(argv)
    printed = capsys.readouterr().out
    code = remote_code_files(
        "geoformers.models.ddcl_incrt.modeling_ddcl_incrt",
        "geoformers.models.ddcl_incrt.configuration_ddcl_incrt",
    )
    assert {p.name for p in tmp_path.iterdir()} == {
        "config.json",
        "model.safetensors",
        "growth_history.json",
        "growth_history.png",
        "summary.json",
        *code,
    }
    assert (tmp_path / "growth_history.png").read_bytes()[:8] == PNG_MAGIC
    assert json.loads((tmp_path / "summary.json").read_text())["num_heads"] == summary["num_heads"]
    # Events are printed as they happen, on global steps: the gate's verdicts once growth starts (step 8).
    events = summary["events"]
    assert events and all(8 < e["step"] <= 24 for e in events)
    assert events[-1]["action"] in ("stop", "full", "grow")
    for event in events:
        assert describe_event(event) in printed
    grown = sum(e["action"] == "grow" for e in events)
    assert summary["num_heads"] == [1 + grown] == summary["reloaded_num_heads"]
    assert "## Heads per layer" in printed and "growth_history.json" in printed
    # The checkpoint reproduces the reported accuracy on a freshly built validation set.
    model = DDCLIncrtForSequenceClassification.from_pretrained(tmp_path)
    task = build_spectral_task(num_train=128, num_validation=64, seed=0)
    assert evaluate_accuracy(model, task["validation"]) == summary["validation_accuracy"]
    history = json.loads((tmp_path / "growth_history.json").read_text())
    assert history["growth_started_at_step"] == 8 and history["events"] == events


def test_grow_demo_is_deterministic_from_its_seed(tmp_path):
    grow_demo = load_script("grow_demo.py")
    argv = TINY_MODEL + [
        "--max_steps",
        "12",
        "--pre_growth_steps",
        "4",
        "--num_train",
        "64",
        "--num_validation",
        "32",
        "--disable_tqdm",
        "true",
    ]
    first = grow_demo.main(argv + ["--output_dir", str(tmp_path / "a")])
    second = grow_demo.main(argv + ["--output_dir", str(tmp_path / "b")])
    assert first["events"] == second["events"]
    assert first["validation_accuracy"] == second["validation_accuracy"]
    weights = [(tmp_path / run / "model.safetensors").read_bytes() for run in ("a", "b")]
    assert weights[0] == weights[1]


# --------------------------------------------------------------------------------------------- experiments


def test_exp_synthetic_reports_order_stop_temperatures_separation_and_seeds(tmp_path):
    exp_synthetic = load_script("exp_synthetic.py")
    result = exp_synthetic.main(
        TINY_MODEL
        + [
            "--seeds",
            "0",
            "--max_steps",
            "16",
            "--pre_growth_steps",
            "6",
            "--num_train",
            "128",
            "--num_validation",
            "32",
            "--probe_rows",
            "32",
            "--probe_every",
            "4",
            "--output_dir",
            str(tmp_path),
        ]
    )
    assert (tmp_path / "synthetic.png").read_bytes()[:8] == PNG_MAGIC
    assert json.loads((tmp_path / "synthetic.json").read_text())["verdicts"] == result["verdicts"]
    assert [run["run"] for run in result["runs"]] == ["seed0"]
    assert result["ablation"]["pre_growth_steps"] == 0
    for run in result["runs"] + [result["ablation"]]:
        assert (tmp_path / run["run"] / "growth_history.json").is_file()
        lambdas = [e["lambda_max"] for e in run["events"] if e["action"] == "grow"]
        assert run["grow_order"][0]["grow_lambdas"] == lambdas
        decreasing = sum(later < earlier for earlier, later in zip(lambdas, lambdas[1:], strict=False))
        assert run["grow_order"][0]["decreasing_pairs"] == decreasing
        exact = run["exact_spectrum_at_growth_start"][0]
        assert exact == sorted(exact, reverse=True) and len(exact) == len(lambdas) + 3
        probe_steps = sorted({0, 4, 8, 12, 16, run["pre_growth_steps"]})  # every 4 and at each phase start
        assert [r["step"] for r in run["probes"]] == probe_steps
        taus = run["temperatures"][0]["temperatures"]
        assert len(taus) == run["num_heads"][0] and all(0.05 < tau < 1.0 + 1e-6 for tau in taus)
        assert len(run["prototype_separation"]) == run["num_heads"][0]
        spectrum = run["head_count_law"]["spectrum_at_growth_start"][0]
        captured = [value for value in exact if value > spectrum["theta_w"]]
        assert spectrum["captured_eigenvalues"][: len(captured)] == captured
    assert result["verdicts"]["head_counts"] == [run["num_heads"] for run in result["runs"]]
    assert result["verdicts"]["finite_stop"] == all(
        run["growth_end"][0]["verdict"] == "stop" for run in result["runs"]
    )


def test_exp_cov2_reports_accuracy_heads_law_and_parameters(tmp_path):
    exp_cov2 = load_script("exp_cov2.py")
    result = exp_cov2.main(
        TINY_MODEL
        + [
            "--num_train_per_lineage",
            "8",
            "--num_validation_per_lineage",
            "4",
            "--genome_length",
            "240",
            "--kmer_size",
            "3",
            "--max_steps",
            "8",
            "--pre_growth_steps",
            "3",
            "--eval_steps",
            "4",
            "--output_dir",
            str(tmp_path),
        ]
    )
    assert (tmp_path / "cov2.png").read_bytes()[:8] == PNG_MAGIC
    assert (tmp_path / "growth_history.json").is_file() and (tmp_path / "cov2.json").is_file()
    assert result["task"]["sequence_length"] == 240 // 3 + 2 and result["task"]["vocab_size"] == 5 + 4**3
    # Warm-up and growth are one Trainer run: evaluated every 4 steps of it (global steps).
    assert [e["step"] for e in result["validation_accuracy_history"]] == [4, 8]
    assert 0 <= result["validation_accuracy"] <= 1 and 0 <= result["baseline"]["accuracy"] <= 1
    # Parameters: an independently built model with the grown head count has exactly as many.
    config = DDCLIncrtConfig(
        vocab_size=5 + 4**3,
        hidden_size=16,
        head_dim=4,
        num_prototypes=4,
        num_heads=result["num_heads"],
        max_position_embeddings=82,
        type_vocab_size=0,
        num_labels=5,
    )
    rebuilt = DDCLIncrtForSequenceClassification(config)
    assert result["parameters"] == sum(parameter.numel() for parameter in rebuilt.parameters())
    law = result["head_count_law"]["trajectory"][0]
    assert law["observed_heads"] == result["num_heads"][0]
    assert law["grow_lambdas"] == [e["lambda_max"] for e in result["events"] if e["action"] == "grow"]
    spectrum = result["head_count_law"]["spectrum_at_growth_start"][0]
    history = json.loads((tmp_path / "growth_history.json").read_text())
    assert spectrum["theta_w"] == history["checks"][0]["theta_w"][0]  # the relative threshold at growth start
    assert not any(e["action"] == "calibrated" for e in result["events"])
    assert all(value > spectrum["theta_w"] for value in spectrum["captured_eigenvalues"])


def test_exp_nonstationary_windows_read_only_their_rows_and_report_the_switch(tmp_path):
    exp_nonstationary = load_script("exp_nonstationary.py")
    result = exp_nonstationary.main(
        TINY_MODEL
        + [
            "--max_steps",
            "24",
            "--switch_step",
            "13",
            "--pre_growth_steps",
            "4",
            "--window_steps",
            "8",
            "--check_every",
            "2",
            "--probe_every",
            "4",
            "--heldout_rows",
            "16",
            "--gate_threshold",
            "calibrated",
            "--output_dir",
            str(tmp_path),
        ]
    )
    assert (tmp_path / "nonstationary.png").read_bytes()[:8] == PNG_MAGIC
    assert (tmp_path / "growth_history.json").is_file() and (tmp_path / "nonstationary.json").is_file()
    assert result["window_boundaries"] == [4, 12, 20]
    events = result["events"]
    assert events[0]["action"] == "calibrated" and events[0]["step"] == 4
    assert sum(e["action"] == "calibrated" for e in events) == 1  # later windows reuse the calibrated gate
    assert all(e["steps_after_switch"] == e["step"] - 13 for e in events)
    verdicts = result["verdicts"]
    assert verdicts["grown_after_switch"] == any(e["action"] == "grow" and e["step"] >= 13 for e in events)
    assert verdicts["heads_at_end"] == [
        1 + sum(e["action"] == "grow" for e in events) - sum(e["action"] == "prune" for e in events)
    ]
    windows = result["events_per_window"]
    assert [(w["start"], w["end"]) for w in windows] == [(4, 12), (12, 20), (20, 24)]
    for action in ("grow", "prune", "stop", "full"):
        assert sum(w[action] for w in windows) == sum(e["action"] == action for e in events)
    steps = [r["step"] for r in result["probes"]]
    assert steps == sorted(set(steps)) and steps[0] == 0 and steps[-1] == 24
    assert len(result["final_accuracy_per_phase"]) == 2
    at_switch = result["energy_at_switch"]
    assert at_switch["step"] == 13
    assert len(at_switch["rows_before"][0]) == len(at_switch["rows_after"][0]) >= 1
    history = json.loads((tmp_path / "growth_history.json").read_text())
    (thresholds,) = result["thresholds"]
    for which, check in (("first_check", history["checks"][0]), ("last_check", history["checks"][-1])):
        assert thresholds[which]["step"] == check["step"]
        assert thresholds[which]["theta_w"] == check["theta_w"][0]
        assert thresholds[which]["phi_g"] == pytest.approx(0.5 * check["theta_w"][0])  # the script's factor


def test_exp_nonstationary_stationary_control_never_switches():
    exp_nonstationary = load_script("exp_nonstationary.py")
    common = [
        "--max_steps",
        "20",
        "--switch_step",
        "10",
        "--pre_growth_steps",
        "4",
        "--per_device_train_batch_size",
        "8",
        "--seed",
        "1",
    ]
    switching = exp_nonstationary.build_streams(exp_nonstationary.parse_args(common))
    control = exp_nonstationary.build_streams(exp_nonstationary.parse_args(common + ["--stationary"]))
    for switched, stationary in zip(switching, control, strict=True):
        assert len(stationary) == len(switched) == 20 * 8
        assert set(stationary["phase"]) == {0} and set(switched["phase"]) == {0, 1}
        relation_tokens = [
            t
            for r in task_spec(switched)["phases"][0]["relations"]
            for t in (r["key_token"], r["query_token"])
        ]
        later = np.asarray(stationary["input_ids"])[10 * 8 :]
        assert np.isin(later, relation_tokens).any()  # the phase-0 relations go on after step 10
    train, heldout = switching
    assert train["input_ids"] != heldout["input_ids"]  # held-out stream: another seed


def test_exp_nonstationary_seeds_summarise_switch_against_stationary(tmp_path):
    exp_nonstationary = load_script("exp_nonstationary.py")
    summary = exp_nonstationary.main(
        TINY_MODEL
        + [
            "--max_steps",
            "16",
            "--switch_step",
            "9",
            "--pre_growth_steps",
            "4",
            "--window_steps",
            "6",
            "--check_every",
            "1",
            "--probe_every",
            "8",
            "--heldout_rows",
            "16",
            "--gate_prune_factor",
            "0.9",
            "--gate_prune_patience",
            "1",
            "--seeds",
            "0",
            "3",
            "--output_dir",
            str(tmp_path),
        ]
    )
    assert [(r["seed"], r["stream"]) for r in summary["runs"]] == [
        (0, "switch"),
        (0, "stationary"),
        (3, "switch"),
        (3, "stationary"),
    ]
    for entry in summary["runs"]:
        result = json.loads(
            (tmp_path / f"seed{entry['seed']}" / entry["stream"] / "nonstationary.json").read_text()
        )
        assert result["stationary"] == (entry["stream"] == "stationary")
        assert (result["final_accuracy_per_phase"][1] is None) == result["stationary"]
        assert result["settings"]["seed"] == entry["seed"]
        for action in ("grow", "prune"):
            assert entry[f"{action}_after"] == sum(
                e["action"] == action and e["step"] >= 9 for e in result["events"]
            )
            assert entry[f"{action}_before"] == sum(
                e["action"] == action and e["step"] < 9 for e in result["events"]
            )
    assert summary["totals"]["switch"]["grow_before"] == sum(
        r["grow_before"] for r in summary["runs"] if r["stream"] == "switch"
    )
    assert sum(summary["totals"]["stationary"].values()) + sum(summary["totals"]["switch"].values()) > 0
    assert json.loads((tmp_path / "summary.json").read_text())["totals"] == summary["totals"]


def test_exp_nonstationary_continuous_checks_every_step_with_one_callback(tmp_path):
    exp_nonstationary = load_script("exp_nonstationary.py")
    result = exp_nonstationary.main(
        TINY_MODEL
        + [
            "--max_steps",
            "16",
            "--switch_step",
            "9",
            "--pre_growth_steps",
            "4",
            "--window_steps",
            "3",
            "--check_every",
            "1",
            "--probe_every",
            "8",
            "--heldout_rows",
            "16",
            "--continuous",
            "--output_dir",
            str(tmp_path),
        ]
    )
    history = json.loads((tmp_path / "growth_history.json").read_text())
    assert "window_steps" not in history and result["settings"]["continuous"]
    assert [check["step"] for check in history["checks"]] == list(range(5, 17))  # regrow: never final
    assert history["growth_stopped_at_step"] is None


def test_exp_nonstationary_relative_threshold_needs_no_calibration_and_moves(tmp_path):
    exp_nonstationary = load_script("exp_nonstationary.py")
    result = exp_nonstationary.main(
        TINY_MODEL
        + [
            "--max_steps",
            "16",
            "--switch_step",
            "9",
            "--pre_growth_steps",
            "4",
            "--window_steps",
            "6",
            "--check_every",
            "1",
            "--probe_every",
            "4",
            "--heldout_rows",
            "16",
            "--output_dir",
            str(tmp_path),
        ]
    )
    assert not any(e["action"] == "calibrated" for e in result["events"])
    history = json.loads((tmp_path / "growth_history.json").read_text())
    assert history["checks"][0]["step"] == 5  # the first growth check decides
    theta = [check["theta_w"][0] for check in history["checks"]]
    assert len(set(theta)) > 1 and all(value > 0 for value in theta)
    (thresholds,) = result["thresholds"]
    assert thresholds["last_check"]["phi_g"] == pytest.approx(0.5 * theta[-1])


# --------------------------------------------------------------------------------------------- the recipe


def record_training_sets(monkeypatch) -> list:
    """The training set of every Trainer `run_growth_training` builds, in order."""
    seen_datasets = []
    original = recipe.Trainer

    def recording_trainer(*args, **kwargs):
        seen_datasets.append(kwargs["train_dataset"])
        return original(*args, **kwargs)

    monkeypatch.setattr(recipe, "Trainer", recording_trainer)
    return seen_datasets


def test_each_window_trainer_and_so_its_gate_sees_only_the_window_rows(tmp_path, monkeypatch):
    """Sequential windows: each phase's Trainer gets exactly its steps' rows of the stream, in order; the
    growth callback draws its gate batches from that Trainer's training set."""
    stream = build_nonstationary_stream(num_steps=12, batch_size=4, switch_step=6, seed=0)
    marked = stream.remove_columns(["phase", "step"]).map(
        lambda row, index: {"input_ids": [index % 40 + 5] + row["input_ids"][1:]}, with_indices=True
    )
    seen_datasets = record_training_sets(monkeypatch)
    args = tiny_args(
        max_steps=12, pre_growth_steps=2, per_device_train_batch_size=4, gate_batch_size=4, check_every=1
    )
    model = build_model(args, vocab_size=48, max_position_embeddings=24, num_labels=2)
    run = run_growth_training(model, args, marked, output_dir=tmp_path, sequential=True, window_steps=4)
    assert [len(d) for d in seen_datasets] == [8, 16, 16, 8]  # steps [0, 2), [2, 6), [6, 10), [10, 12)
    markers = [row[0] for d in seen_datasets for row in d["input_ids"]]
    assert markers == [index % 40 + 5 for index in range(48)]
    history = run.history
    assert history["growth_started_at_step"] == 2 and history["window_steps"] == 4
    assert [check["step"] for check in history["checks"]][:4] == [3, 4, 5, 6]
    assert all(2 <= record["step"] <= 12 for record in history["checks"] + history["events"])


def test_recent_stream_rows_are_the_rows_of_the_last_steps():
    assert recent_stream_rows(3, 4, 0) == range(0, 4)  # before any step: the first step's rows
    assert recent_stream_rows(3, 4, 2) == range(0, 8)
    assert recent_stream_rows(3, 4, 7) == range(16, 28)  # steps 4, 5, 6


def test_continuous_growth_is_one_regrowing_trainer_whose_gate_reads_only_recent_rows(tmp_path, monkeypatch):
    """gate_window_steps: one Trainer over the whole stream whose callback starts after pre-growth; every gate
    batch holds rows of the last gate_window_steps steps only (rows read back from their tokens 1 and 2)."""
    stream = build_nonstationary_stream(num_steps=12, batch_size=4, switch_step=6, seed=0)
    signed = sign_rows(stream.remove_columns(["phase", "step"]))
    seen_datasets, gate_rows = record_training_sets(monkeypatch), []
    args = tiny_args(
        max_steps=12, pre_growth_steps=2, per_device_train_batch_size=4, gate_batch_size=6, check_every=1
    )
    model = build_model(args, vocab_size=48, max_position_embeddings=24, num_labels=2)
    measure = model.gate_second_moments

    def recording_moments(input_ids, **kwargs):
        gate_rows.append(set(signed_row_indices(input_ids)))
        return measure(input_ids, **kwargs)

    monkeypatch.setattr(model, "gate_second_moments", recording_moments)
    run = run_growth_training(model, args, signed, output_dir=tmp_path, sequential=True, gate_window_steps=2)
    assert [len(d) for d in seen_datasets] == [48]  # steps [0, 12): pre-growth and growth in one Trainer
    steps = [check["step"] for check in run.history["checks"]]
    assert steps == list(range(3, 13))  # regrow: a check at every step, also after a stop
    assert len(gate_rows) == len(steps)
    for step, rows in zip(steps, gate_rows, strict=True):
        window = set(recent_stream_rows(2, 4, step))
        assert len(rows) == min(6, len(window)) and rows <= window, step
    with pytest.raises(ValueError, match="gate_window_steps"):
        run_growth_training(
            model, args, signed, output_dir=tmp_path, sequential=True, window_steps=4, gate_window_steps=2
        )
    with pytest.raises(ValueError, match="gate_window_steps"):
        run_growth_training(model, args, signed, output_dir=tmp_path, gate_window_steps=2)


def test_regrow_keeps_checking_after_a_stop(tmp_path):
    """--regrow: the callback's stop is not final, so the gate checks at every step to the end; without it the
    first stop ends the checks (theta_w = 50 ||A_sym||_F: lambda_max is below it at every check)."""
    task = build_spectral_task(num_train=64, num_validation=8, seed=0)
    steps = {}
    for regrow in (False, True):
        args = tiny_args(max_steps=10, pre_growth_steps=2, check_every=1, gate_calibration_factor=50.0)
        args.regrow = regrow
        model = build_model(args, vocab_size=48, max_position_embeddings=24, num_labels=2)
        run = run_growth_training(model, args, task["train"], output_dir=tmp_path / str(regrow))
        steps[regrow] = [check["step"] for check in run.history["checks"]]
        assert {e["action"] for e in run.history["events"]} == {"stop"} and model.config.num_heads == [1]
    assert steps[True] == list(range(3, 11)) and steps[False] == steps[True][: len(steps[False])]
    assert len(steps[False]) < len(steps[True])
    assert experiment_parser().parse_args(["--regrow"]).regrow and not tiny_args().regrow


def test_gate_spectrum_matches_a_float64_reference():
    args = tiny_args(initial_heads=2)
    model = build_model(args, vocab_size=48, max_position_embeddings=24, num_labels=2).eval()
    task = build_spectral_task(num_train=16, num_validation=8, seed=0)
    batch = rows_as_batch(task["train"], range(16))
    batch.pop("labels")
    with torch.no_grad():
        hidden = model.model.embeddings(batch["input_ids"], None, None).double().reshape(-1, 16)
    chosen = torch.linspace(0, hidden.shape[0] - 1, 128).round().long()  # --gate_num_tokens evenly spaced
    second_moment = hidden[chosen].T @ hidden[chosen] / 128
    attention = model.model.layers[0].attention
    directional = sum(
        (h.q_proj.weight.detach().double().T @ h.k_proj.weight.detach().double()) for h in attention.heads
    )
    directional = (directional - directional.T) / 2
    interaction = second_moment @ directional
    reference = torch.linalg.eigvalsh((interaction + interaction.T) / 2).flip(0)
    spectrum = gate_spectrum(model, batch, num_tokens=args.gate_num_tokens)[0]
    scale = float(reference.abs().max())
    assert spectrum == pytest.approx(reference.tolist(), abs=1e-4 * scale)
    assert sum(spectrum) == pytest.approx(0.0, abs=1e-4 * scale)  # A_sym = sym(C M_a) is traceless


def test_prototype_probe_matches_direct_computation():
    args = tiny_args(initial_heads=2)
    model = build_model(args, vocab_size=48, max_position_embeddings=24, num_labels=2)
    task = build_spectral_task(num_train=16, num_validation=8, seed=0)
    batch = rows_as_batch(task["validation"], range(5))  # 5 x 24 = 120 tokens: all sampled by the gate
    record = PrototypeProbe(batch, every=1).record(model, step=3)
    assert model.training  # restored
    model.eval()
    with torch.no_grad():
        outputs = model(**batch)
        hidden = model.model.embeddings(batch["input_ids"], None, None).double().reshape(-1, 16)
    second_moment = hidden.T @ hidden / hidden.shape[0]
    for head, energy in zip(model.model.layers[0].attention.heads, record["head_energy"][0], strict=True):
        product = head.q_proj.weight.detach().double().T @ head.k_proj.weight.detach().double()
        expected = torch.linalg.matrix_norm(second_moment @ (product - product.T) / 2)
        assert energy == pytest.approx(float(expected), rel=1e-4)
    accuracy = (outputs.logits.argmax(-1) == batch["labels"]).double().mean()
    assert record["step"] == 3 and record["accuracy"] == pytest.approx(float(accuracy))
    assert record["l_q"] == pytest.approx(record["l_ols"] + record["prototype_variance"], rel=1e-5)
    assert record["temperatures"][0] == pytest.approx([1.0, 1.0])


def test_switch_probe_measures_both_sides_of_the_switch_with_the_same_weights():
    exp_nonstationary = load_script("exp_nonstationary.py")
    model = build_model(tiny_args(initial_heads=3), vocab_size=48, max_position_embeddings=24, num_labels=2)
    validation = build_spectral_task(num_train=16, num_validation=16, seed=0)["validation"]

    def rows(step: int) -> dict:
        return rows_as_batch(validation, range(2 * step - 8, 2 * step - 4))  # steps 6 / 7: disjoint rows

    probe = exp_nonstationary.SwitchProbe(rows, every=100, switch_step=7)
    for step in (6, 7):
        probe.on_step_end(None, argparse.Namespace(global_step=step), None, model=model)
        assert (probe.at_switch is None) == (step == 6)
    assert model.training and probe.at_switch["step"] == 7
    for key, step in (("rows_before", 6), ("rows_after", 7)):  # PrototypeProbe: checked against fp64 above
        expected = PrototypeProbe(rows(step), every=1).record(model, step)["head_energy"]
        assert probe.at_switch[key][0] == pytest.approx(expected[0], rel=1e-6)
    before, after = probe.at_switch["rows_before"][0], probe.at_switch["rows_after"][0]
    assert before != after and len(before) == 3 and len(probe.at_switch["rows_after"]) == 1
    assert probe.at_switch["ratio"][0] == pytest.approx([a / b for a, b in zip(after, before, strict=True)])


# --------------------------------------------------------------------------------------------- analysis


def history_with(events: list[dict], checks: list[dict], initial=(1,), final=(3,)) -> dict:
    return {"initial_num_heads": list(initial), "num_heads": list(final), "events": events, "checks": checks}


def test_head_count_law_matches_a_hand_computation():
    checks = [
        {"step": s, "action": [a], "lambda_max": [v], "theta_w": [0.05]}
        for s, a, v in ((10, "grow", 0.9), (11, "grow", 0.3), (12, "stop", 0.1))
    ]
    events = [
        {"step": 10, "layer": 0, "action": "grow", "lambda_max": 0.9},
        {"step": 11, "layer": 0, "action": "grow", "lambda_max": 0.3},
        {"step": 12, "layer": 0, "action": "stop", "lambda_max": 0.1},
    ]
    (law,) = head_count_law(history_with(events, checks))
    # rho = (0.1 / 0.9)^(1/2) = 1/3, kappa_T^2 = 1 / (1 - 1/3) = 3/2, K* = 1.5 log(0.9 / 0.05) = 1.5 log 18.
    assert law["rho"] == pytest.approx(1 / 3) and law["lambda_end"] == 0.1
    assert law["kappa_T"] == pytest.approx(math.sqrt(1.5))
    assert law["predicted_heads"] == pytest.approx(1.5 * math.log(18))
    assert law["ratio"] == pytest.approx(1.5 * math.log(18) / 3)
    assert law["gamma_res0"] == 0.9 and law["theta_w"] == 0.05


def test_spectrum_head_count_law_matches_a_hand_computation():
    spectra = [[0.8, 0.2, 0.04, -0.04, -0.2, -0.8], [0.01, -0.01]]
    wide, quiet = spectrum_head_count_law(spectra, theta_w=[0.1, 0.1], observed_heads=[4, 1])
    # Captured 0.8 > 0.2 > theta_w: kappa_T = 0.8 / 0.2 = 4, K* = 16 log(0.8 / 0.1) = 16 log 8.
    assert wide["captured_eigenvalues"] == [0.8, 0.2] and wide["kappa_T"] == pytest.approx(4.0)
    assert wide["predicted_heads"] == pytest.approx(16 * math.log(8))
    assert wide["ratio"] == pytest.approx(4 * math.log(8))
    assert quiet["captured_eigenvalues"] == [] and quiet["predicted_heads"] == 0.0
    assert quiet["kappa_T"] is None
    with pytest.raises(ValueError, match="theta_w"):
        spectrum_head_count_law(spectra, theta_w=[0.1], observed_heads=[4, 1])


def test_heads_at_a_higher_factor_by_hand():
    def check(step, lambda_max, theta_w, action, heads):
        return {
            "step": step,
            "lambda_max": [lambda_max],
            "theta_w": [theta_w],
            "action": [action],
            "num_heads": [heads],
        }

    # a run at factor 0.1; ratios lambda_max / ||A_sym||_F = 0.1 lambda_max / theta_w: .5, .3, .4, .15, .08
    history = {
        "initial_num_heads": [1],
        "checks": [
            check(201, 0.5, 0.1, "grow", 2),
            check(202, 0.3, 0.1, "pending", 2),
            check(203, 0.8, 0.2, "grow", 3),
            check(204, 0.15, 0.1, "grow", 4),
            check(205, 0.08, 0.1, "stop", 4),
        ],
    }
    expected = {  # factor -> (heads, heads if the pending check had stopped, step of the stop)
        0.1: (4, 4, 205),
        0.2: (3, 3, 204),  # the grow at ratio 0.15 becomes a stop
        0.35: (3, 2, 204),  # 0.4 still grows; the pending 0.3 could have stopped with two heads
        0.6: (1, 1, 201),
    }
    for factor, (heads, bound, step) in expected.items():
        assert heads_at_factor(history, factor, 0.1) == [
            {"layer": 0, "heads": heads, "heads_if_pending_stop": bound, "step": step}
        ]
    with pytest.raises(ValueError, match="factor"):
        heads_at_factor(history, 0.05, 0.1)


def test_head_count_law_is_undefined_without_growth_or_contraction():
    stop = [{"step": 5, "action": ["stop"], "lambda_max": [0.01], "theta_w": [0.05]}]
    (quiet,) = head_count_law(
        history_with([{"step": 5, "layer": 0, "action": "stop", "lambda_max": 0.01}], stop, final=(1,))
    )
    assert quiet["predicted_heads"] is None and quiet["kappa_T"] is None and quiet["gamma_res0"] == 0.01
    rising = [{"step": s, "layer": 0, "action": "grow", "lambda_max": v} for s, v in ((1, 0.2), (2, 0.4))]
    checks = [
        {"step": s, "action": ["grow"], "lambda_max": [v], "theta_w": [0.05]} for s, v in ((1, 0.2), (2, 0.4))
    ]
    (growing,) = head_count_law(history_with(rising, checks))
    assert growing["kappa_T"] is None and growing["predicted_heads"] is None  # lambda grew: no contraction
    assert growing["rho"] == pytest.approx(2**0.5) and growing["lambda_end"] == 0.4
    (empty,) = head_count_law(history_with([], [], final=(1,)))
    assert empty["gamma_res0"] is None and empty["ratio"] is None


def test_grow_order_stop_summary_and_temperature_split():
    events = [
        {"step": 1, "layer": 0, "action": "grow", "lambda_max": 0.5, "theta_w": 0.1},
        {"step": 2, "layer": 0, "action": "grow", "lambda_max": 0.7, "theta_w": 0.1},
        {"step": 3, "layer": 0, "action": "grow", "lambda_max": 0.2, "theta_w": 0.1},
        {"step": 4, "layer": 0, "action": "stop", "lambda_max": 0.05, "theta_w": 0.1},
        {"step": 4, "layer": 1, "action": "full", "lambda_max": 0.3, "theta_w": 0.1},
    ]
    history = history_with(events, [], initial=(1, 1), final=(4, 1))
    order = grow_order(history)
    assert order[0] == {
        "layer": 0,
        "grow_lambdas": [0.5, 0.7, 0.2],
        "pairs": 2,
        "decreasing_pairs": 1,
        "decreasing": False,
    }
    assert order[1]["decreasing"] and order[1]["pairs"] == 0
    ends = stop_summary(history)
    assert [(e["verdict"], e["step"]) for e in ends] == [("stop", 4), ("full", 4)]
    split = temperature_split([[0.06, 0.9, 0.52, 0.53]], tau_min=0.05, tau_init=1.0)
    assert split[0]["threshold"] == pytest.approx(0.525)
    assert split[0]["local_heads"] == [0, 2] and split[0]["global_heads"] == [1, 3]


def test_write_json_writes_non_finite_numbers_as_null(tmp_path):
    content = {"a": float("nan"), "b": [1.0, float("inf")], "c": np.float32(2.5)}
    write_json_atomically(tmp_path / "r.json", content)
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": None, "b": [1.0, None], "c": 2.5}


def test_write_json_interrupted_mid_write_leaves_the_previous_file(tmp_path, monkeypatch):
    """A write killed before its rename (a killed sweep) must not truncate the runs saved before, nor leave
    its temporary file."""
    target = tmp_path / "summary.json"
    write_json_atomically(target, {"runs": [1, 2, 3]})

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomically(target, {"runs": [1, 2, 3, 4]})
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"runs": [1, 2, 3]}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["summary.json"]
    write_json_atomically(str(target), {"runs": [1, 2, 3, 4]})
    assert json.loads(target.read_text()) == {"runs": [1, 2, 3, 4]}


def test_markdown_table_formats_cells_and_aligns_columns():
    rows = [["a", 0.123456, None], ["b", 12, "1,234"]]
    table = markdown_table(["name", "value", "note"], rows, align="lrl")
    assert table.splitlines() == [
        "| name | value | note |",
        "|---|---:|---|",
        "| a | 0.1235 | - |",
        "| b | 12 | 1,234 |",
    ]
    assert markdown_table(["x"], [[1.0]]).splitlines()[1] == "|---|"
    with pytest.raises(ValueError, match="`align` needs one 'l' or 'r' per column"):
        markdown_table(["x", "y"], [], align="l")


def test_evaluate_accuracy_counts_argmax_hits():
    task = build_cov2_variant_task(
        num_train_per_lineage=2, num_validation_per_lineage=2, genome_length=60, kmer_size=3, seed=0
    )
    args = tiny_args()
    model = build_model(args, vocab_size=69, max_position_embeddings=22, num_labels=5).eval()
    batch = rows_as_batch(task["validation"], range(10))
    with torch.no_grad():
        expected = (model(input_ids=batch["input_ids"]).logits.argmax(-1) == batch["labels"]).double().mean()
    assert evaluate_accuracy(model, task["validation"], batch_size=3) == pytest.approx(float(expected))


# --------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("script", "argv", "flag"),
    [
        ("grow_demo.py", ["--pre_growth_steps", "10", "--max_steps", "10"], "--pre_growth_steps"),
        ("grow_demo.py", ["--check_every", "0"], "--check_every"),
        ("grow_demo.py", ["--dropout", "1.5"], "--dropout"),
        ("grow_demo.py", ["--learning_rate", "0"], "--learning_rate"),
        ("exp_synthetic.py", ["--probe_rows", "5000"], "--probe_rows"),
        ("exp_synthetic.py", ["--collapse_ratio", "2"], "--collapse_ratio"),
        ("exp_cov2.py", ["--warmup_steps", "-1"], "--warmup_steps"),
        ("exp_nonstationary.py", ["--switch_step", "2000"], "--switch_step"),
        ("exp_nonstationary.py", ["--seeds", "1", "1"], "--seeds"),
        ("exp_nonstationary.py", ["--window_steps", "0"], "--window_steps"),
    ],
)
def test_bad_arguments_are_refused_naming_the_flag(script, argv, flag, capsys):
    with pytest.raises(SystemExit) as error:
        load_script(script).parse_args(argv)
    assert error.value.code == 2
    assert flag in capsys.readouterr().err


def test_a_bad_model_field_raises_naming_the_config_field(tmp_path):
    grow_demo = load_script("grow_demo.py")
    with pytest.raises(ValueError, match="head_dim"):
        grow_demo.main(["--hidden_size", "8", "--head_dim", "16", "--output_dir", str(tmp_path)])


# ----------------------------------------------------------------------------------------------------------
# How the scripts share code and threads


def test_no_script_imports_another_script_or_edits_sys_path():
    """Scripts share code through `scripts/harness/` only (docs/experiments.md, 'Flags')."""
    scripts = Path(__file__).resolve().parents[1] / "scripts"
    names = {path.stem for path in scripts.glob("*.py")}
    offenders = []
    for path in [*scripts.glob("*.py"), *scripts.glob("harness/*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            imported = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [f"{path.name} imports {name}" for name in imported if name.split(".")[0] in names]
            is_attribute = isinstance(node, ast.Attribute)
            if is_attribute and (getattr(node.value, "id", ""), node.attr) == ("sys", "path"):
                offenders.append(f"{path.name} uses sys.path")
    assert not offenders, offenders


def test_threads_default_to_one_and_reject_bad_counts(restore_torch_threads):
    for arguments in (RecipeArguments, LMArguments):  # DDCL-INCRT experiments, causal-LM scripts
        assert HfArgumentParser(arguments).parse_args([]).threads == 1
    torch.set_num_threads(2)
    set_threads(0)  # 0: leave torch's default
    assert torch.get_num_threads() == 2
    set_threads(1)
    assert torch.get_num_threads() == 1
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="--threads"):
            set_threads(bad)


def test_write_results_records_command_environment_and_portable_settings(tmp_path, capsys):
    settings = {"output_dir": str(REPO_ROOT / "results" / "x"), "data": tmp_path / "corpus.txt", "seed": 3}
    record = write_results(tmp_path / "r.json", "exp_x.py", ["--seed", "3"], settings, {"accuracy": 0.5})
    assert json.loads((tmp_path / "r.json").read_text()) == record
    assert record["command"] == "python scripts/exp_x.py --seed 3" and record["accuracy"] == 0.5
    assert record["settings"] == {"output_dir": "results/x", "data": str(tmp_path / "corpus.txt"), "seed": 3}
    assert record["environment"]["threads"] == torch.get_num_threads()
    assert f"wrote {tmp_path / 'r.json'}" in capsys.readouterr().out

"""`scripts/exp_grown_vs_swept.py`: the step-parameter compute proxy and the summary against hand
computations, bad flags, and a tiny planted sweep end to end (parameter counts against freshly built
models, resumption)."""

import json

import pytest
from script_modules import load_script

from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification
from geoformers.training.synthetic_tasks import build_majority_relations_task, build_spectral_task, task_spec


@pytest.fixture(scope="module")
def script():
    return load_script("exp_grown_vs_swept.py")


def test_step_parameters_count_each_shape_for_the_steps_it_trained(script):
    history = {
        "initial_num_heads": [1],
        "num_heads": [2],
        "events": [
            {"step": 10, "action": "grow", "num_heads": [2]},
            {"step": 15, "action": "grow", "num_heads": [3]},
            {"step": 18, "action": "prune", "num_heads": [2]},
            {"step": 20, "action": "stop", "num_heads": [2]},
        ],
    }
    # 100 parameters with one head, 120 with two: 10 steps x 100 + 5 x 120 + 3 x 140 + 12 x 120
    assert script.step_parameters(history, 30, 100, 120) == 10 * 100 + 5 * 120 + 3 * 140 + 12 * 120
    assert script.step_parameters(None, 30, 100, 100) == 3000
    unchanged = {"initial_num_heads": [1, 1], "num_heads": [1, 1], "events": [{"step": 4, "action": "stop"}]}
    assert script.step_parameters(unchanged, 30, 100, 100) == 3000


def record(kind, heads, accuracy, time, compute, num_heads=None, gate_time=None):
    return {
        "kind": kind,
        "initial_heads": heads,
        "accuracy": accuracy,
        "train_time_s": time,
        "step_parameters": compute,
        "num_heads": num_heads or [heads],
        "gate_time_s": gate_time,
    }


def test_summary_best_count_knee_gap_and_cost_ratios(script):
    runs = [
        record("static", 1, 0.70, 10, 100),
        record("static", 1, 0.80, 12, 100),
        record("static", 2, 0.90, 20, 200),
        record("static", 2, 0.90, 20, 200),
        record("static", 3, 0.92, 30, 300),
        record("static", 3, 0.90, 30, 300),
        record("grown", 1, 0.90, 15, 150, [2], gate_time=1.5),
        record("grown", 1, 0.88, 17, 170, [3], gate_time=3.4),
        record("grown", 1, 0.89, 16, 160, [2], gate_time=0.8),
    ]
    summary = script.summarise(runs, tolerance=0.015)
    assert summary["grown"]["gate_share"] == pytest.approx(0.1)  # median of 0.1, 0.2, 0.05
    assert [(row["heads"], row["seeds"]) for row in summary["static"]] == [(1, 2), (2, 2), (3, 2)]
    assert summary["static"][0]["accuracy"] == pytest.approx(0.75)
    assert summary["static"][0]["accuracy_std"] == pytest.approx(0.0707106781, abs=1e-9)
    assert summary["static"][0]["train_time_s"] == 11
    assert (summary["best_static_heads"], summary["knee_heads"]) == (3, 2)  # 0.90 >= 0.91 - 0.015
    assert summary["grown"]["accuracy"] == pytest.approx(0.89) and summary["grown"]["heads"] == [2, 3, 2]
    assert summary["gap_to_best"] == pytest.approx(0.02)
    assert summary["sweep"] == {"counts": 3, "train_time_s": 11 + 20 + 30, "step_parameters": 600}
    assert summary["time_ratio"] == pytest.approx(16 / 61)
    assert summary["compute_ratio"] == pytest.approx(160 / 600)
    assert summary["claim"] == {
        "within_tolerance": False,
        "under_a_third_of_the_sweep": True,
        "heads_at_the_knee": True,
        "heads_within_one_of_the_knee": True,
    }
    assert "grown" not in script.summarise(runs[:6], tolerance=0.015)
    untimed = runs[:8] + [record("grown", 1, 0.89, 16, 160, [5])]  # saved before checks were timed
    summary = script.summarise(untimed, tolerance=0.015)
    assert summary["grown"]["gate_share"] is None
    assert summary["claim"]["heads_within_one_of_the_knee"] and not summary["claim"]["heads_at_the_knee"]


def test_factor_study_of_a_run_and_its_summary(script):
    def check(step, lambda_max, action, heads):  # theta_w = 0.1 ||A_sym||_F with ||A_sym||_F = 1
        return {
            "step": step,
            "lambda_max": [lambda_max],
            "theta_w": [0.1],
            "action": [action],
            "num_heads": [heads],
        }

    history = {
        "initial_num_heads": [1],
        "checks": [check(1, 0.45, "grow", 2), check(2, 0.22, "grow", 3), check(3, 0.05, "stop", 3)],
    }
    study = script.factor_study(history, DDCLIncrtConfig())
    # stops at ratio 0.45 for factors >= 0.45, at 0.22 for factors in [0.22, 0.45), else where the run did
    assert study == {
        "0.1": [3],
        "0.15": [3],
        "0.2": [3],
        "0.25": [2],
        "0.3": [2],
        "0.35": [2],
        "0.4": [2],
        "0.5": [1],
        "0.6": [1],
    }
    higher = script.factor_study(history, DDCLIncrtConfig(gate_calibration_factor=0.3))
    assert list(higher) == ["0.3", "0.35", "0.4", "0.5", "0.6"]
    assert script.factor_study(history, DDCLIncrtConfig(gate_rule="bidirectional")) is None
    assert script.factor_study(None, DDCLIncrtConfig()) is None
    runs = [record("static", 1, 0.9, 10, 100), record("static", 2, 0.9, 10, 100)]
    for heads, cut in ((3, 2), (4, 2), (2, 1)):
        runs.append(
            {**record("grown", 1, 0.9, 10, 100, [heads]), "heads_at_factor": {"0.1": [heads], "0.3": [cut]}}
        )
    summary = script.summarise(runs, tolerance=0.005)
    assert summary["factor_study"] == {
        "0.1": {"heads": [3, 4, 2], "median": 3},
        "0.3": {"heads": [2, 2, 1], "median": 2},
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["--static_heads", "0"],
        ["--max_heads", "1"],
        ["--tolerance", "1"],
        ["--task_flags", "bert=--num_train_epochs 1"],
        ["--tasks", "imdb"],
        ["--tasks", "needs3"],
        ["--task_flags", "needs3=--max_steps 2"],
        ["--grown_flags", "bert=--gate_calibration_factor 0.3"],
        ["--static_from", "no/such/folder"],
    ],
)
def test_bad_flags_are_refused(script, argv):
    with pytest.raises(SystemExit):
        script.parse_args(argv)


def test_a_tiny_planted_sweep_end_to_end_and_its_resumption(script, tmp_path, monkeypatch):
    argv = [
        "--tasks",
        "planted",
        "--seeds",
        "0",
        "--static_heads",
        "1",
        "2",
        "--max_heads",
        "4",
        "--output_dir",
        str(tmp_path),
        "--runs_dir",
        str(tmp_path / "runs"),
        "--task_flags",
        "planted=--max_steps 12 --pre_growth_steps 4 --num_train 64 --num_validation 32 --probe_rows 16",
    ]
    result = script.main(argv)["planted"]
    saved = json.loads((tmp_path / "planted.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(result["summary"]))
    assert (tmp_path / "planted.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = saved["runs"]
    spec = task_spec(build_spectral_task(num_train=64, num_validation=32, seed=0))
    assert [(r["kind"], r["initial_heads"], r["max_heads"]) for r in runs] == [
        ("static", 1, 1),
        ("static", 2, 2),
        ("grown", 1, 4),
    ]
    for run in runs:
        assert run["steps"] == 12 and 0 <= run["accuracy"] <= 1
        fresh = DDCLIncrtForSequenceClassification(
            DDCLIncrtConfig(
                vocab_size=spec["vocab_size"],
                max_position_embeddings=spec["seq_len"],
                hidden_size=64,
                head_dim=8,
                num_heads=run["num_heads"],
                max_heads=run["max_heads"],
                num_prototypes=16,
                num_labels=2,
                type_vocab_size=0,
            )
        )
        assert run["parameters"] == sum(p.numel() for p in fresh.parameters())
    static = runs[:2]
    assert all(r["step_parameters"] == 12 * r["parameters"] for r in static)
    assert static[0]["num_heads"] == [1] and static[1]["num_heads"] == [2]
    grown = runs[2]
    assert grown["initial_parameters"] == static[0]["parameters"]
    assert 12 * grown["initial_parameters"] <= grown["step_parameters"] <= 12 * grown["parameters"]
    assert all(r["gate_time_s"] is None for r in static)
    assert 0 < grown["gate_time_s"] < grown["train_time_s"]  # the checks' time, part of the training time
    assert saved["summary"]["grown"]["gate_share"] == grown["gate_time_s"] / grown["train_time_s"]

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(script, "run_one", no_training)
    assert script.main(argv)["planted"]["summary"] == result["summary"]


def test_a_tiny_needs_k_sweep_builds_the_task_and_shape_of_its_head_need(script, tmp_path, monkeypatch):
    tiny = "--max_steps 8 --pre_growth_steps 4 --num_train 64 --num_validation 32 --probe_rows 16"
    argv = [
        "--tasks",
        "needs2",
        "needs4",
        "--seeds",
        "1",
        "--static_heads",
        "2",
        "--max_heads",
        "3",
        "--output_dir",
        str(tmp_path),
        "--runs_dir",
        str(tmp_path / "runs"),
        "--task_flags",
        f"needs2={tiny}",
        f"needs4={tiny} --hidden_size 16",
    ]
    results = script.main(argv)
    for task, k, hidden in (("needs2", 2, 64), ("needs4", 4, 16)):
        runs = json.loads((tmp_path / f"{task}.json").read_text())["runs"]
        assert [(r["kind"], r["initial_heads"], r["max_heads"]) for r in runs] == [
            ("static", 2, 2),
            ("grown", 1, 3),
        ]
        assert results[task]["summary"]["knee_heads"] == 2
        spec = task_spec(build_majority_relations_task(k, num_train=64, num_validation=32, seed=0))
        for run in runs:
            # the needs-k shape, read from the parameter count: heads of one dimension, 2^k classes
            fresh = DDCLIncrtForSequenceClassification(
                DDCLIncrtConfig(
                    vocab_size=spec["vocab_size"],
                    max_position_embeddings=spec["seq_len"],
                    hidden_size=hidden,
                    head_dim=1,
                    num_heads=run["num_heads"],
                    max_heads=run["max_heads"],
                    num_prototypes=16,
                    num_labels=2**k,
                    type_vocab_size=0,
                    pooling="cls",
                )
            )
            assert run["parameters"] == sum(p.numel() for p in fresh.parameters())
            assert run["steps"] == 8 and 0 <= run["accuracy"] <= 1

    # grown runs with their own gate flags, the static runs taken from the first sweep's files
    trained = []
    run_one = script.run_one

    def counting(train, planned, folder):
        trained.append((planned["kind"], planned["grown_flags"]))
        return run_one(train, planned, folder)

    monkeypatch.setattr(script, "run_one", counting)
    factors = []
    build_model = script.build_model

    def recording(args, **shape):
        factors.append(args.gate_calibration_factor)
        return build_model(args, **shape)

    monkeypatch.setattr(script, "build_model", recording)
    again = [
        *argv[: argv.index("--output_dir")],
        "--output_dir",
        str(tmp_path / "factor"),
        "--runs_dir",
        str(tmp_path / "runs_factor"),
        "--task_flags",
        f"needs2={tiny}",
        f"needs4={tiny} --hidden_size 16",
        "--static_from",
        str(tmp_path),
        "--grown_flags",
        "needs2=--gate_calibration_factor 0.5",
    ]
    script.main(again)
    factor = ["--gate_calibration_factor", "0.5"]
    assert trained == [("grown", factor), ("grown", [])]
    runs = json.loads((tmp_path / "factor" / "needs2.json").read_text())["runs"]
    first = json.loads((tmp_path / "needs2.json").read_text())["runs"]
    assert runs[0] == first[0] and runs[1]["grown_flags"] == factor
    assert factors == [0.5, 0.1]  # the grown needs2 run got its flag; needs4's grown run the default

"""`scripts/exp_growth_stop.py`: how each layer-run's growth ended, the stop fractions, the trajectories kept
for the runs that did not stop (hand-made histories), and one tiny sweep end to end."""

import json

import pytest
from script_modules import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("exp_growth_stop.py")


def history(actions_per_check, events):
    """Two layers; check k at step k + 1 with lambda_max k / 10 and theta_w 1 / 4 on both layers."""
    checks = [
        {
            "step": k + 1,
            "lambda_max": [k / 10, k / 10],
            "theta_w": [0.25, 0.25],
            "action": list(actions),
            "num_heads": [1 + k, 2],
        }
        for k, actions in enumerate(actions_per_check)
    ]
    return {"num_heads": [len(checks), 2], "checks": checks, "events": events}


def test_layer_endings_keep_the_first_verdict_and_trajectories_only_for_failures(script):
    actions = [("grow", "grow"), ("grow", "stop"), ("grow", "stop"), ("full", "stop"), ("full", "stop")]
    events = [
        {"step": 2, "layer": 1, "action": "stop"},
        {"step": 4, "layer": 0, "action": "full"},
        {"step": 5, "layer": 1, "action": "stop"},
    ]
    endings = script.layer_endings(history(actions, events), points=2)
    assert [(e["verdict"], e["step"], e["heads"]) for e in endings] == [("full", 4, 5), ("stop", 2, 2)]
    assert "trajectory" not in endings[1]
    # 5 checks thinned to every 3rd (steps 1 and 4), plus the last one (step 5)
    assert [(p["step"], p["lambda_max"], p["theta_w"], p["action"]) for p in endings[0]["trajectory"]] == [
        (1, 0.0, 0.25, "grow"),
        (4, 0.3, 0.25, "full"),
        (5, 0.4, 0.25, "full"),
    ]
    neither = script.layer_endings(history([("grow", "dwell")], []), points=40)
    assert [e["verdict"] for e in neither] == [None, None] and len(neither[1]["trajectory"]) == 1


def test_summary_counts_stop_full_and_neither_per_task_and_rule(script):
    def run(rule, verdicts, cap=16):
        return {
            "task": "planted",
            "rule": rule,
            "max_heads": cap,
            "layers": [{"verdict": v, "heads": 3} for v in verdicts],
        }

    rows = script.summarise(
        [
            run("relative", ["stop", "stop"]),
            run("calibrated", ["full", None], cap=24),
            run("relative", ["full", "stop"], cap=5),
        ]
    )
    assert [
        (r["rule"], r["max_heads"], r["layer_runs"], r["stop"], r["full"], r["neither"], r["stop_fraction"])
        for r in rows
    ] == [("relative", [5, 16], 4, 3, 1, 0, 0.75), ("calibrated", [24], 2, 0, 1, 1, 0.0)]
    assert [r["cap_at_least_twice_final"] for r in rows] == [False, True]  # 3 heads under a cap of 5: not


def test_rule_caps_and_a_resumed_sweep_runs_only_what_is_missing(script, tmp_path, monkeypatch):
    calls = []

    def fake_run(task, rule, seed, args):
        calls.append((rule, seed, args.caps[rule]))
        return {
            "task": task,
            "rule": rule,
            "seed": seed,
            "max_heads": args.caps[rule],
            "extra": args.extra,
            "command": "fake",
            "layers": [{"verdict": "stop", "heads": 2}],
            "wall_time_s": 0.0,
        }

    monkeypatch.setattr(script, "run", fake_run)
    argv = [
        "--tasks",
        "planted",
        "--rules",
        "relative",
        "bidirectional",
        "--rule_max_heads",
        "bidirectional=24",
        "--output_dir",
        str(tmp_path),
    ]
    script.main([*argv, "--seeds", "0"])
    assert calls == [("relative", 0, 16), ("bidirectional", 0, 24)]
    result = script.main([*argv, "--seeds", "0", "1"])  # seed 0 is kept, seed 1 added
    assert calls[2:] == [("relative", 1, 16), ("bidirectional", 1, 24)]
    assert [(r["rule"], r["seed"]) for r in result["runs"]] == [
        ("relative", 0),
        ("relative", 1),
        ("bidirectional", 0),
        ("bidirectional", 1),
    ]
    script.main([*argv, "--seeds", "1", "--rule_max_heads", "bidirectional=32"])  # a new cap is a new run
    assert calls[4:] == [("bidirectional", 1, 32)]
    saved = json.loads((tmp_path / "growth_stop_planted.json").read_text())
    assert [(r["rule"], r["seed"], r["max_heads"]) for r in saved["runs"]] == [
        ("relative", 1, 16),
        ("bidirectional", 1, 32),
    ]


def test_bad_arguments_are_refused(script):
    with pytest.raises(SystemExit):
        script.parse_args(["--max_heads", "1"])
    with pytest.raises(SystemExit):
        script.parse_args(["--rules", "fixed"])
    for item in ("bidirectional=1", "greedy=8", "relative"):
        with pytest.raises(SystemExit):
            script.parse_args(["--rule_max_heads", item])


@pytest.mark.slow
def test_a_tiny_planted_sweep_writes_the_summary_of_every_rule(script, tmp_path):
    result = script.main(
        [
            "--tasks",
            "planted",
            "--seeds",
            "0",
            "--rules",
            "relative",
            "calibrated",
            "--max_heads",
            "6",
            "--output_dir",
            str(tmp_path),
            "--runs_dir",
            str(tmp_path / "runs"),
            "--extra",
            "--max_steps",
            "30",
            "--pre_growth_steps",
            "10",
            "--num_train",
            "128",
            "--num_validation",
            "32",
            "--probe_rows",
            "16",
            "--eval_steps",
            "30",
        ]
    )
    saved = json.loads((tmp_path / "growth_stop_planted.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(result["summary"]))
    assert [row["rule"] for row in saved["summary"]] == ["relative", "calibrated"]
    for run in saved["runs"]:
        history = json.loads(
            (
                tmp_path / "runs" / "planted" / run["rule"] / "seed0" / "seed0" / "growth_history.json"
            ).read_text()
        )
        assert [layer["heads"] for layer in run["layers"]] == history["num_heads"]
        assert "--max_heads 6" in run["command"]


def test_a_run_that_stops_below_its_cap_is_the_same_run_under_a_higher_cap(script, tmp_path):
    """The cap enters only the "full" verdict (the gate's buffers of cap rows start at zero and draw no random
    numbers), so raising it does not change a run that stopped below it: every check's lambda_max, theta_w
    and action and every event are equal."""
    histories = []
    for cap in (7, 14):
        script.trainer_defaults(
            [
                "--seed",
                "0",
                "--gate_threshold",
                "relative",
                "--gate_rule",
                "max_only",
                "--max_heads",
                str(cap),
                "--output_dir",
                str(tmp_path / str(cap)),
                "--max_steps",
                "150",
                "--check_every",
                "15",
            ]
        )
        histories.append(json.loads((tmp_path / str(cap) / "growth_history.json").read_text()))
    small, large = histories
    ends = [e for e in small["events"] if e["action"] in ("stop", "full")]
    assert ends[0]["action"] == "stop" and 1 < small["num_heads"][0] < 7
    assert small["num_heads"] == large["num_heads"] and small["events"] == large["events"]
    assert small["checks"] == large["checks"]

"""What the main job (`scripts/grow_demo.py`) tells a reader: how the gate decides, one sentence per growth
event (`harness.printing.describe_event`: what was measured, against what, what was decided), a closing
summary in words, and progress bars that printed lines do not break."""

import pytest
from script_modules import load_script
from test_experiment_scripts import TINY_MODEL

from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig

from harness.printing import describe_event

GROW = {"step": 201, "layer": 0, "action": "grow", "lambda_max": 0.3505, "theta_w": 0.0526, "head": 1}
TINY = [
    *TINY_MODEL,
    *("--max_steps", "24", "--pre_growth_steps", "8", "--num_train", "128", "--num_validation", "64"),
    *("--eval_steps", "12"),
]

pytestmark = pytest.mark.usefixtures("restore_torch_threads")


@pytest.fixture(scope="module")
def grow_demo():
    return load_script("grow_demo.py")


def test_a_grow_sentence_names_the_measure_the_threshold_and_the_decision():
    sentence = describe_event({**GROW, "num_heads": [2, 1]})
    assert sentence == (
        "step 201: layer 0 grows a head, heads [1, 1] -> [2, 1]: lambda_max = 0.3505 is above "
        "theta_w = 0.0526, so a new head takes that direction."
    )
    # the second layer's growth changes only its own count
    assert "heads [2, 1] -> [2, 2]" in describe_event({**GROW, "layer": 1, "num_heads": [2, 2]})


def test_stop_full_prune_and_calibration_sentences():
    stop = {
        **GROW,
        "step": 203,
        "action": "stop",
        "lambda_max": 0.06306,
        "theta_w": 0.06876,
        "num_heads": [3],
    }
    assert describe_event(stop) == (
        "step 203: layer 0 stops growing at heads [3]: lambda_max = 0.06306 is not above theta_w = "
        "0.06876, so no direction left is strong enough for a new head."
    )
    full = {**stop, "action": "full", "lambda_max": 0.5, "num_heads": [8]}
    assert "is above theta_w = 0.06876, but the layer has max_heads heads" in describe_event(full)
    prune = {
        "step": 9,
        "layer": 1,
        "action": "prune",
        "head": 2,
        "energy": 0.001,
        "theta_w": 0.1,
        "num_heads": [3, 2],
    }
    assert describe_event(prune).startswith(
        "step 9: layer 1 prunes head 2, heads now [3, 2]: its directional"
    )
    calibrated = {"step": 4, "layer": 0, "action": "calibrated", "theta_w": 0.25, "num_heads": [1]}
    assert describe_event(calibrated) == (
        "step 4: layer 0 sets its threshold theta_w = 0.25 (this check only calibrates)."
    )


def test_the_gate_explanation_follows_the_threshold_rule(grow_demo):
    relative = grow_demo.gate_explanation(DDCLIncrtConfig(hidden_size=16, head_dim=4))
    assert (
        "theta_w = 0.1 x ||A_sym||_F" in relative
        and "lambda_max, the largest eigenvalue of A_res" in relative
    )
    calibrated = grow_demo.gate_explanation(
        DDCLIncrtConfig(hidden_size=16, head_dim=4, gate_threshold="calibrated", gate_calibration_factor=0.2)
    )
    assert "0.2 x the median ||A_res||_F of the first checks, then fixed" in calibrated
    fixed = grow_demo.gate_explanation(DDCLIncrtConfig(hidden_size=16, head_dim=4, gate_theta_w=0.3))
    assert "a fixed threshold theta_w = 0.3" in fixed


def test_the_summary_in_words_reads_each_layer_and_the_accuracy(grow_demo, tmp_path):
    summary = {
        "events": [
            {**GROW, "num_heads": [2, 1]},
            {**GROW, "step": 202, "num_heads": [3, 1]},
            {
                **GROW,
                "step": 203,
                "action": "stop",
                "lambda_max": 0.06306,
                "theta_w": 0.06876,
                "num_heads": [3, 1],
            },
        ],
        "growth_end": [
            {"layer": 0, "verdict": "stop", "step": 203, "lambda_max": 0.06306, "theta_w": 0.06876},
            {"layer": 1, "verdict": None, "step": None, "lambda_max": None, "theta_w": None},
        ],
        "initial_num_heads": [1, 1],
        "num_heads": [3, 1],
        "reloaded_num_heads": [3, 1],
        "validation_accuracy": 0.937,
        "chance_accuracy": 0.5,
        "task": {"bayes_accuracy": 0.9778, "num_validation": 1000},
        "parameters": 11597,
    }
    words = grow_demo.summary_in_words(summary, tmp_path).splitlines()
    assert words[0] == (
        "Layer 0 went from 1 to 3 head(s), growing at step(s) 201, 202; growth ended at step 203, when "
        "lambda_max (0.0631) was no longer above theta_w (0.0688)."
    )
    assert words[1].startswith("Layer 1 went from 1 to 1 head(s); the gate gave it no stop verdict")
    # 0.937 / 0.9778 = 0.95827...
    assert "93.7% of the 1,000 validation rows correctly: 95.8% of the best possible" in words[2]
    assert "(Bayes accuracy 97.8%), against 50% by chance." in words[2]
    assert (
        f"reloads with heads [3, 1]: AutoModelForSequenceClassification.from_pretrained({str(tmp_path)!r})"
        in words[3]
    )


def test_the_run_prints_sentences_and_a_summary_and_keeps_one_progress_bar(grow_demo, tmp_path, capsys):
    summary = grow_demo.main(TINY + ["--output_dir", str(tmp_path)])
    captured = capsys.readouterr()
    out = captured.out
    assert out.index("How the gate decides") < out.index("step 9: layer 0")
    for event in summary["events"]:
        assert describe_event(event) in out.splitlines()  # each event on a line of its own
    assert out.rstrip().splitlines()[-1].startswith("It is saved in")
    assert "\n## In words\nLayer 0 went from 1 to" in out
    assert '{"validation_accuracy"' not in out
    # no evaluation bar under the training bar: its cursor-up escapes are what broke the printed lines
    assert "\x1b[A" not in captured.err
    assert "24/24" in captured.err

"""`plot_growth_history` (training/growth.py): the figure a person reads a growth run from. Checked on the
drawn matplotlib objects of a hand-written history: each gate verdict marked at its step and head count,
the warm-up and the after-stop phase shaded over their exact spans, lambda_max and theta_w on a log axis of
steps since growth started, reference accuracies drawn inside the accuracy axis; bad reference values."""

import math

import numpy as np
import pytest
from matplotlib.image import imread
from matplotlib.patches import Rectangle

from geoformers.training.growth import plot_growth_history

# warm-up to step 4; grow at 5 and 6, stop at 7; checks go on to step 12 (pruning on); run ends at 20
CHECKS = [
    {"step": 5, "num_heads": [2], "lambda_max": [0.40], "theta_w": [0.05], "action": ["grow"]},
    {"step": 6, "num_heads": [3], "lambda_max": [0.12], "theta_w": [0.06], "action": ["grow"]},
    {"step": 7, "num_heads": [3], "lambda_max": [0.05], "theta_w": [0.07], "action": ["stop"]},
] + [
    {"step": step, "num_heads": [3], "lambda_max": [0.9], "theta_w": [0.2], "action": ["stop"]}
    for step in range(8, 13)
]
EVENTS = [
    {"step": 5, "layer": 0, "action": "grow", "lambda_max": 0.40, "theta_w": 0.05, "num_heads": [2]},
    {"step": 6, "layer": 0, "action": "grow", "lambda_max": 0.12, "theta_w": 0.06, "num_heads": [3]},
    {"step": 7, "layer": 0, "action": "stop", "lambda_max": 0.05, "theta_w": 0.07, "num_heads": [3]},
]
HISTORY = {
    "initial_num_heads": [1],
    "checks": CHECKS,
    "events": EVENTS,
    "growth_started_at_step": 4,
    "growth_stopped_at_step": 7,
}
EVALUATIONS = [{"step": 10, "eval_accuracy": 0.82}, {"step": 20, "eval_accuracy": 0.86}, {"step": 20}]
REFERENCES = {"Bayes": 0.9, "chance": 0.5}


@pytest.fixture(scope="module")
def figure(tmp_path_factory):
    path = tmp_path_factory.mktemp("plot") / "growth.png"
    drawn = plot_growth_history(
        HISTORY, path, log_history=EVALUATIONS, last_step=20, reference_accuracy=REFERENCES
    )
    image = imread(path)
    assert image.shape[:2] == (750, 700) and image[..., :3].std() > 0.05  # three panels, drawn
    return drawn


def shaded_spans(axis) -> list[tuple[float, float]]:
    return sorted(
        (patch.get_x(), patch.get_x() + patch.get_width())
        for patch in axis.patches
        if isinstance(patch, Rectangle)
    )


def test_each_verdict_is_marked_at_its_step_and_head_count(figure):
    heads_axis = figure.axes[0]
    marked = {tuple(point) for collection in heads_axis.collections for point in collection.get_offsets()}
    assert marked == {(5.0, 2.0), (6.0, 3.0), (7.0, 3.0)}
    labels = heads_axis.get_legend_handles_labels()[1]
    assert "grow: λ_max > θ_w, a head added" in labels and "stop: λ_max ≤ θ_w, growth ends" in labels
    assert heads_axis.get_xlim() == (0.0, 20.0)


def test_warm_up_and_after_stop_are_shaded_over_their_spans(figure):
    heads_axis, gate_axis, accuracy_axis = figure.axes
    assert shaded_spans(heads_axis) == shaded_spans(accuracy_axis) == [(0.0, 4.0), (7.0, 20.0)]
    # the gate axis counts steps since growth started (step 4): the stop is 3 steps in
    assert shaded_spans(gate_axis) == [(3.0, 16.0)]


def test_the_gate_panel_shows_lambda_max_against_theta_w_on_log_axes(figure):
    gate_axis = figure.axes[1]
    assert gate_axis.get_xscale() == "log" and gate_axis.get_yscale() == "log"
    lines = {line.get_label(): line for line in gate_axis.get_lines()}
    lambda_line = lines["λ_max(A_res), layer 0"]
    theta_line = lines["θ_w, layer 0: grow while λ_max is above"]
    assert list(lambda_line.get_xdata()) == list(range(1, 9))
    assert list(lambda_line.get_ydata()) == [check["lambda_max"][0] for check in CHECKS]
    assert list(theta_line.get_ydata()) == [check["theta_w"][0] for check in CHECKS]
    low, high = gate_axis.get_xlim()
    assert low < 1 and high >= 8
    texts = " ".join(text.get_text() for text in gate_axis.texts)
    assert "adds no head" in texts  # checks after the stop are explained, not read as a broken gate
    # verdict markers at (steps since start, lambda_max)
    marked = {tuple(point) for collection in gate_axis.collections for point in collection.get_offsets()}
    assert marked == {(1.0, 0.40), (2.0, 0.12), (3.0, 0.05)}


def test_reference_accuracies_are_lines_inside_the_accuracy_axis(figure):
    accuracy_axis = figure.axes[2]
    levels = {line.get_label(): line.get_ydata()[0] for line in accuracy_axis.get_lines()}
    assert levels["Bayes 0.900"] == 0.9 and levels["chance 0.500"] == 0.5
    evaluated = next(line for line in accuracy_axis.get_lines() if line.get_label() == "validation accuracy")
    assert list(evaluated.get_xdata()) == [10, 20] and list(evaluated.get_ydata()) == [0.82, 0.86]
    low, high = accuracy_axis.get_ylim()
    assert low < 0.5 and high > 0.9 and high - low < 0.5  # all of them, and not much more


def test_without_checks_after_the_stop_the_gate_axis_ends_near_the_last_check(tmp_path):
    history = {**HISTORY, "checks": CHECKS[:3]}
    gate_axis = plot_growth_history(history, tmp_path / "short.png", last_step=2000).axes[1]
    assert math.isclose(gate_axis.get_xlim()[1], 6.0)  # 2 x the last check (3 steps in), not 1,996
    assert "no check after the stop" in " ".join(text.get_text() for text in gate_axis.texts)
    assert not np.isnan(gate_axis.get_ylim()).any()


def test_a_run_that_never_stops_has_no_after_stop_shading(tmp_path):
    history = {**HISTORY, "events": EVENTS[:2], "growth_stopped_at_step": None}
    heads_axis = plot_growth_history(history, tmp_path / "growing.png", last_step=20).axes[0]
    assert shaded_spans(heads_axis) == [(0.0, 4.0)]


@pytest.mark.parametrize(
    ("references", "error", "match"),
    [
        ({"Bayes": 1.5}, ValueError, r"reference_accuracy\['Bayes'\]"),
        ({"Bayes": "high"}, TypeError, "reference_accuracy"),
        (0.9, TypeError, "reference_accuracy"),
    ],
)
def test_bad_reference_accuracy_is_named(tmp_path, references, error, match):
    with pytest.raises(error, match=match):
        plot_growth_history(HISTORY, tmp_path / "bad.png", reference_accuracy=references)
    assert not (tmp_path / "bad.png").exists()

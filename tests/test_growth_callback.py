"""IncrtGrowthCallback inside the stock Trainer: a planted spectrum grows exactly its heads then stops; the
planted spectral task grows heads with logs, growth_history.json and the plot; three seeds; bad input."""

import json
import math
from functools import partial

import pytest
import torch
from growth_worker import (
    GATE_TOKENS,
    growth_callback,
    growth_trainer,
    sign_rows,
    signed_row_indices,
    spectral_task,
    tiny_model,
    training_args,
)
from matplotlib.image import imread
from torch.utils.data import IterableDataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback

from geoformers.training.growth import HISTORY_FILE, PLOT_FILE, IncrtGrowthCallback, plot_growth_history

from harness.recipe import recent_stream_rows

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def task():
    return spectral_task()


def symmetric_interaction(moment: torch.Tensor, head) -> torch.Tensor:
    """fp64 A_sym = sym(C M_a) of one head, M_a = (W_Q W_K^T - W_K W_Q^T) / 2 (INCRT gate)."""
    product = head.q_proj.weight.double().T @ head.k_proj.weight.double()
    interaction = moment @ (product - product.T) / 2
    return (interaction + interaction.T) / 2


def test_planted_spectrum_grows_exactly_the_heads_above_theta_then_stops(task, tmp_path):
    """Head 0 plants M_a with sym(C M_a) eigenvalues +-8, +-6, +-1 for the data's C; theta_w = 3 and frozen
    weights (lr 0): the Trainer run must grow two heads, along lambda 8 then 6, then record the stop."""
    model = tiny_model(head_dim=4, max_heads=6, gate_theta_w=3.0, gate_prune_factor=0.0)
    moment = model.gate_second_moments(torch.tensor(task["train"]["input_ids"][:256]), num_tokens=2048)
    moment = moment[0].double()
    spectrum, basis = torch.linalg.eigh(moment)
    head = model.model.layers[0].attention.heads[0]
    with torch.no_grad():
        head.q_proj.weight.zero_()
        head.k_proj.weight.zero_()
        for row, value in enumerate([8.0, 6.0, 1.0]):  # mu (v_i v_j^T - v_j v_i^T): eigenvalues +-value
            i, j = len(spectrum) - 1 - row, row
            head.q_proj.weight[row] = (4 * value / (spectrum[i] - spectrum[j]) * basis[:, i]).float()
            head.k_proj.weight[row] = basis[:, j].float()
    planted = torch.linalg.eigvalsh(symmetric_interaction(moment, head))
    assert planted[-3:].tolist() == pytest.approx([1.0, 6.0, 8.0], rel=1e-4)

    args = training_args(tmp_path, max_steps=12, learning_rate=0.0)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=task["train"],
        callbacks=[IncrtGrowthCallback(check_every=2, gate_batch_size=64, gate_num_tokens=2048)],
    )
    trainer.train()
    history = growth_callback(trainer).history
    grown = [e for e in history["events"] if e["action"] == "grow"]
    assert [e["step"] for e in grown] == [2, 4] and [e["head"] for e in grown] == [1, 2]
    assert grown[0]["lambda_max"] > grown[1]["lambda_max"]  # heads come in decreasing eigenvalue order
    assert [e["lambda_max"] for e in grown] == pytest.approx([8.0, 6.0], rel=0.15)  # C of one gate batch
    stop = history["events"][-1]
    assert stop["action"] == "stop" and stop["step"] == 6 and stop["lambda_max"] < 3.0
    assert history["growth_stopped_at_step"] == 6 and model.config.num_heads == [3]
    assert [c["step"] for c in history["checks"]] == [2, 4, 6]  # no pruning: checks end with growth


def plant_coupling(head, moment, row: int, value: float) -> None:
    """Row `row` of head 0's q/k = mu (v_i v_j^T - v_j v_i^T) with i = d-1-row, j = row: sym(C M_a) gets
    eigenvalues +-value on (v_i +- v_j) / sqrt(2) (C = sum c_i v_i v_i^T)."""
    spectrum, basis = torch.linalg.eigh(moment)
    i, j = len(spectrum) - 1 - row, row
    with torch.no_grad():
        head.q_proj.weight[row] = (4 * value / (spectrum[i] - spectrum[j]) * basis[:, i]).float()
        head.k_proj.weight[row] = basis[:, j].float()


class PlantAtStep(TrainerCallback):
    """Plants a new coupling (eigenvalue 10) in head 0 after optimizer step `step`: new structure appears."""

    def __init__(self, moment, step):
        self.moment, self.step = moment, step

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            plant_coupling(model.model.layers[0].attention.heads[0], self.moment, row=3, value=10.0)


@pytest.mark.parametrize("regrow", [False, True])
def test_regrow_lets_a_stopped_layer_grow_again_when_new_structure_appears(task, tmp_path, regrow):
    """Frozen weights, theta_w = 3: heads along 8 and 6, stop at step 6; at step 7 a coupling of 10 appears.
    Without `regrow` the stop is final; with it the next check (step 8) grows a head along the new 10."""
    model = tiny_model(head_dim=4, max_heads=6, gate_theta_w=3.0, gate_prune_factor=0.0)
    moment = model.gate_second_moments(torch.tensor(task["train"]["input_ids"][:256]), num_tokens=2048)
    moment = moment[0].double()
    head = model.model.layers[0].attention.heads[0]
    with torch.no_grad():
        head.q_proj.weight.zero_()
        head.k_proj.weight.zero_()
    for row, value in enumerate([8.0, 6.0]):
        plant_coupling(head, moment, row, value)
    args = training_args(tmp_path, max_steps=14, learning_rate=0.0)
    growth = IncrtGrowthCallback(check_every=2, gate_batch_size=64, gate_num_tokens=2048, regrow=regrow)
    trainer = Trainer(
        model=model, args=args, train_dataset=task["train"], callbacks=[growth, PlantAtStep(moment, step=7)]
    )
    trainer.train()
    history = growth.history
    actions = [(e["step"], e["action"]) for e in history["events"]]
    if not regrow:
        assert actions == [(2, "grow"), (4, "grow"), (6, "stop")] and model.config.num_heads == [3]
        assert history["growth_stopped_at_step"] == 6
        return
    # the stop at 6 and the repeated stops after the regrowth are recorded once each
    assert actions == [(2, "grow"), (4, "grow"), (6, "stop"), (8, "grow"), (10, "stop")]
    assert history["events"][3]["lambda_max"] == pytest.approx(10.0, rel=0.15)
    assert model.config.num_heads == [4] and history["growing"] == [True]
    assert history["growth_stopped_at_step"] is None
    assert [c["step"] for c in history["checks"]] == [2, 4, 6, 8, 10, 12, 14]


@pytest.mark.parametrize("regrow", [False, True])
def test_gate_rows_restrict_every_gate_batch_to_the_rows_of_its_step(task, tmp_path, monkeypatch, regrow):
    """gate_rows(step) = the rows of the last 3 steps of a sequential stream of 8 rows per step: every gate
    batch (the calibration at step 0 and each check) holds only those rows, gate_batch_size of them."""
    model = tiny_model(gate_prune_factor=0.0, gate_threshold="calibrated")
    seen = []
    measure = model.gate_second_moments

    def recording(input_ids, **kwargs):
        seen.append(sorted(signed_row_indices(input_ids)))
        return measure(input_ids, **kwargs)

    monkeypatch.setattr(model, "gate_second_moments", recording)

    last_steps = partial(recent_stream_rows, 3, 8)
    growth = IncrtGrowthCallback(check_every=2, gate_batch_size=6, gate_rows=last_steps, regrow=regrow)
    args = training_args(
        tmp_path, max_steps=10, train_sampling_strategy="sequential", per_device_train_batch_size=8
    )
    Trainer(
        model=model, args=args, train_dataset=sign_rows(task["train"].select(range(80))), callbacks=[growth]
    ).train()
    calibrations = model.config.gate_calibration_checks
    checked_steps = [0] * calibrations + [check["step"] for check in growth.history["checks"]]
    assert len(seen) == len(checked_steps) and len(growth.history["checks"]) >= 1
    for step, rows in zip(checked_steps, seen, strict=True):
        allowed = set(last_steps(step))
        assert len(rows) == len(set(rows)) == 6 and set(rows) <= allowed, (step, rows)


@pytest.mark.parametrize(
    ("gate_rows", "message"),
    [
        (lambda step: [], r"gate_rows\(0\)` must return a non-empty"),
        (lambda step: [0, 10_000], "outside the training set"),
    ],
)
def test_gate_rows_that_name_no_row_or_a_missing_row_are_refused(task, tmp_path, gate_rows, message):
    model = tiny_model(gate_threshold="calibrated")
    trainer = Trainer(
        model=model,
        args=training_args(tmp_path, max_steps=2),
        train_dataset=task["train"],
        callbacks=[IncrtGrowthCallback(gate_rows=gate_rows)],
    )
    with pytest.raises(ValueError, match=message):  # the calibration's gate batch at step 0 is drawn first
        trainer.train()


@pytest.fixture(scope="module")
def planted_task_run(task, tmp_path_factory):
    """40 steps of real training on the planted task, gate every 5 steps (theta_w calibrated at step 0)."""
    output_dir = tmp_path_factory.mktemp("growth_run")
    model = tiny_model(gate_threshold="calibrated")
    trainer = growth_trainer(model, training_args(output_dir, max_steps=40), task["train"], check_every=5)
    trainer.train()
    return trainer, output_dir


def test_training_on_the_planted_task_grows_heads_and_stops_growing(planted_task_run):
    trainer, _ = planted_task_run
    model, history = trainer.model, growth_callback(trainer).history
    events = history["events"]
    assert events[0] == {
        "step": 0,
        "layer": 0,
        "action": "calibrated",
        "theta_w": events[0]["theta_w"],
        "num_heads": [1],
    }
    assert events[0]["theta_w"] > 0 and all(c["theta_w"] == [events[0]["theta_w"]] for c in history["checks"])
    grown = [e for e in events if e["action"] == "grow"]
    assert len(grown) >= 1 and all(e["lambda_max"] > e["theta_w"] for e in grown)
    assert [e["head"] for e in grown] == list(range(1, len(grown) + 1))
    assert model.config.num_heads == history["num_heads"] == [1 + len(grown)]
    stopped = history["growth_stopped_at_step"]
    assert stopped is not None and events[-1]["action"] in ("stop", "full") and events[-1]["step"] == stopped
    after = [c["num_heads"] for c in history["checks"] if c["step"] >= stopped]
    assert all(heads == model.config.num_heads for heads in after) and len(after) >= 3
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(losses) == 40 and all(math.isfinite(loss) for loss in losses)


def test_every_event_is_in_the_trainer_log_and_the_optimizer_holds_exactly_the_parameters(planted_task_run):
    trainer, _ = planted_task_run
    history = growth_callback(trainer).history
    logged = {entry["step"]: entry for entry in trainer.state.log_history if "loss" in entry}
    for check in history["checks"]:
        entry = logged[check["step"]]
        assert entry["incrt/num_heads_layer0"] == check["num_heads"][0]
        assert entry["incrt/lambda_max_layer0"] == check["lambda_max"][0]
        assert entry["incrt/theta_w_layer0"] == check["theta_w"][0]
    parameters = [p for _, p in trainer.model.named_parameters()]
    held = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    assert len(held) == len(parameters) and {id(p) for p in held} == {id(p) for p in parameters}
    assert set(trainer.optimizer.state) == set(held)  # every parameter, grown ones included, was stepped
    order = {id(p): index for index, p in enumerate(parameters)}
    for group in trainer.optimizer.param_groups:
        assert [order[id(p)] for p in group["params"]] == sorted(order[id(p)] for p in group["params"])


def test_growth_history_file_and_plot(planted_task_run):
    trainer, output_dir = planted_task_run
    history = json.loads((output_dir / HISTORY_FILE).read_text())
    assert history == json.loads(json.dumps(growth_callback(trainer).history))
    image = imread(output_dir / PLOT_FILE)
    assert image.shape[0] > 300 and image.shape[1] > 500 and image[..., :3].std() > 0.05  # a drawn figure


def test_the_plot_adds_an_accuracy_panel_when_the_run_was_evaluated(tmp_path):
    """An accuracy panel is added only when the log history holds evaluations (entries without
    `eval_accuracy` are skipped)."""
    check = {"step": 6, "num_heads": [2], "lambda_max": [0.5], "theta_w": [0.2], "action": ["stop"]}
    history = {
        "initial_num_heads": [1],
        "checks": [check],
        "growth_started_at_step": 4,
        "growth_stopped_at_step": 6,
        "events": [{"step": 6, "layer": 0, "action": "grow", "lambda_max": 0.5, "theta_w": 0.2}],
    }
    plot_growth_history(history, tmp_path / "plain.png", last_step=40)
    evaluations = [{"step": 20, "eval_accuracy": 0.6}, {"step": 40, "eval_accuracy": 0.8}, {"step": 40}]
    plot_growth_history(history, tmp_path / "accuracy.png", log_history=evaluations, last_step=40)
    plain, accuracy = imread(tmp_path / "plain.png"), imread(tmp_path / "accuracy.png")
    assert (plain.shape[0], accuracy.shape[0]) == (550, 750)  # a third panel


def test_three_seeds_reach_head_counts_within_one_per_layer(task, tmp_path):
    """Same data, seeds 0, 1, 2. INCRT claims the grown structure is unique; on this task the calibrated
    theta_w (from the untrained model) is soon far below lambda_max, so the counts reached are reported
    (pytest -s) and compared, not claimed to measure the task."""
    counts = []
    for seed in range(3):
        model = tiny_model(seed=seed, max_heads=6, gate_threshold="calibrated")
        args = training_args(tmp_path / f"seed{seed}", max_steps=24, seed=seed, logging_steps=24)
        trainer = growth_trainer(model, args, task["train"], check_every=3)
        trainer.train()
        assert growth_callback(trainer).history["growth_stopped_at_step"] is not None
        counts.append(model.config.num_heads)
    print("final head counts per seed:", counts)
    for layer in range(len(counts[0])):
        per_seed = [heads[layer] for heads in counts]
        assert max(per_seed) - min(per_seed) <= 1, counts


def test_start_step_makes_warm_up_and_growth_one_trainer_run(task, tmp_path, monkeypatch):
    """start_step=6: no gate batch before optimizer step 6; the calibration checks run at step 6, the gate
    checks every 2 steps after it; the weights before step 6 move as without the callback."""
    model = tiny_model(gate_threshold="calibrated", gate_calibration_checks=2, gate_prune_factor=0.05)
    reference = tiny_model()
    callback = IncrtGrowthCallback(check_every=2, start_step=6, gate_num_tokens=GATE_TOKENS)
    constant = {"lr_scheduler_type": "constant"}  # the same learning rates up to step 6 in both runs
    trainer = Trainer(
        model=model,
        args=training_args(tmp_path, max_steps=12, **constant),
        train_dataset=task["train"],
        callbacks=[callback],
    )
    measured_at, weights_at_start = [], {}
    measure = model.gate_second_moments

    def recording_moments(*args, **kwargs):
        if not measured_at:
            weights_at_start.update({k: v.clone() for k, v in model.state_dict().items() if "gate" not in k})
        measured_at.append(trainer.state.global_step)
        return measure(*args, **kwargs)

    monkeypatch.setattr(model, "gate_second_moments", recording_moments)
    trainer.train()
    history = callback.history
    assert measured_at == [6, 6, 8, 10, 12]  # pruning is on, so checks go on after growth stops
    assert [check["step"] for check in history["checks"]] == [8, 10, 12]
    calibrated = [event for event in history["events"] if event["action"] == "calibrated"]
    assert [event["step"] for event in calibrated] == [6]
    assert all(event["step"] >= 8 for event in history["events"] if event["action"] != "calibrated")
    assert history["growth_started_at_step"] == 6
    Trainer(
        model=reference,
        args=training_args(tmp_path / "plain", max_steps=6, **constant),
        train_dataset=task["train"],
    ).train()
    for name, value in reference.state_dict().items():
        if "gate" not in name:
            torch.testing.assert_close(weights_at_start[name], value, rtol=0, atol=0, msg=name)


# --------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"check_every": 0}, ValueError, "check_every"),
        ({"check_every": "5"}, ValueError, "check_every"),
        ({"gate_batch_size": 0}, ValueError, "gate_batch_size"),
        ({"gate_batch_size": 2.5}, ValueError, "gate_batch_size"),
        ({"save_plot": "yes"}, TypeError, "save_plot"),
        ({"regrow": 1}, TypeError, "regrow"),
        ({"gate_rows": [1, 2]}, TypeError, "gate_rows"),
        ({"start_step": -1}, ValueError, "start_step"),
        ({"start_step": 2.0}, ValueError, "start_step"),
        ({"start_step": True}, ValueError, "start_step"),
    ],
)
def test_bad_callback_arguments_name_the_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        IncrtGrowthCallback(**kwargs)


def test_a_model_other_than_ddcl_incrt_is_refused(task, tmp_path):
    config = BertConfig(
        vocab_size=48,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=24,
    )
    trainer = Trainer(
        model=BertForSequenceClassification(config),
        args=training_args(tmp_path, max_steps=2),
        train_dataset=task["train"],
        callbacks=[IncrtGrowthCallback()],
    )
    with pytest.raises(TypeError, match="DDCL-INCRT"):
        trainer.train()


def test_an_iterable_training_set_is_refused(task, tmp_path):
    rows = [{k: torch.tensor(v) for k, v in row.items()} for row in task["train"].select(range(64))]

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(rows)

    trainer = Trainer(
        model=tiny_model(),
        args=training_args(tmp_path, max_steps=2),
        train_dataset=Stream(),
        callbacks=[IncrtGrowthCallback()],
    )
    with pytest.raises(ValueError, match="map-style"):
        trainer.train()


@pytest.fixture
def one_process_group():
    """A single-process gloo group (an in-memory store), as `fully_shard` needs one."""
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("shard", ["layers", "root"])
def test_a_model_sharded_by_fsdp2_is_refused_with_ddp_named(task, tmp_path, one_process_group, shard):
    from torch.distributed.fsdp import FSDPModule, fully_shard

    model = tiny_model()
    targets = list(model.model.layers) if shard == "layers" else [*model.model.layers, model]
    for module in targets:
        fully_shard(module)
    assert isinstance(model.model.layers[0], FSDPModule)
    assert isinstance(model, FSDPModule) == (shard == "root")
    trainer = Trainer(
        model=model,
        args=training_args(tmp_path, max_steps=2),
        train_dataset=task["train"],
        callbacks=[IncrtGrowthCallback()],
    )
    with pytest.raises(ValueError, match="FSDP.*use DDP"):
        trainer.train()
    assert model.config.num_heads == tiny_model().config.num_heads  # nothing grew

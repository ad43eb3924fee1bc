"""Sinkhorn's row/column error logged in training (the one approximate chart):
`register_chart_observer` and `ChartViolationCallback`, against hand-computed violations and a stock
`Trainer` run."""

import pytest
import torch
from datasets import Dataset
from transformers import Trainer, TrainingArguments
from transformers.utils import logging

from geoformers import DDLmHCConfig, DDLmHCForCausalLM
from geoformers.modeling.ops import charts
from geoformers.modeling.ops.charts import birkhoff, ds_violation, register_chart_observer
from geoformers.training.chart_monitor import LOG_KEY, ChartViolationCallback


def test_observer_sees_every_eager_chart_until_removed():
    seen = []
    handle = register_chart_observer(lambda method, x: seen.append((method, x)))
    logits = torch.randn(5, 16, requires_grad=True)
    out = birkhoff(logits, 4, "sinkhorn", iters=2)
    birkhoff(torch.zeros(9), 4, "tbp")
    handle.remove()
    birkhoff(torch.zeros(9), 4, "rtbp")
    assert [method for method, _ in seen] == ["sinkhorn", "tbp"]
    assert torch.equal(seen[0][1], out.detach()) and not seen[0][1].requires_grad
    assert not charts._observers


def test_callback_keeps_the_worst_sinkhorn_error_of_each_interval():
    callback = ChartViolationCallback(tolerance=0.1)
    off = torch.tensor([[[0.7, 0.3], [0.3, 0.5]]])  # row 2 sums to 0.8, column 2 to 0.8: violation 0.2
    callback.observe("sinkhorn", torch.eye(2)[None])
    callback.observe("sinkhorn", off)
    callback.observe("tbp", torch.full((1, 2, 2), 9.0))  # exact charts are not watched
    logs = {}
    state = type("State", (), {"global_step": 3, "log_history": [{"step": 3}]})()
    callback.on_log(None, state, None, logs=logs)
    assert logs[LOG_KEY] == pytest.approx(0.2) == state.log_history[-1][LOG_KEY]
    assert float(ds_violation(off)) == pytest.approx(0.2)
    logs = {}
    callback.on_log(None, state, None, logs=logs)  # nothing computed since: nothing logged
    assert LOG_KEY not in logs
    with pytest.raises(ValueError, match="tolerance"):
        ChartViolationCallback(tolerance=-1.0)


def first_step_reference(model: DDLmHCForCausalLM, ids: torch.Tensor) -> float:
    """Worst chart error of one forward, from the returned mixing: H_res = (1 - a) I + a chart misses
    doubly-stochastic by exactly a times the chart's error."""
    with torch.no_grad():
        records = model(ids, output_mixing=True).mixing
    connections = [c for layer in model.model.layers for c in (layer.attn_connection, layer.mlp_connection)]
    return max(
        float(ds_violation(record.h_res).max()) / float(torch.sigmoid(connection.res_mix_logit))
        for record, connection in zip(records, connections, strict=True)
    )


@pytest.mark.parametrize(("tolerance", "warns"), [(0.0, True), (1.0, False)])
def test_trainer_logs_the_sinkhorn_error_and_warns_above_the_tolerance(tmp_path, tolerance, warns):
    torch.manual_seed(0)
    config = DDLmHCConfig(
        vocab_size=31,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=1,
        num_attention_heads=2,
        hc_streams=4,
        hc_chart="sinkhorn",
    )
    model = DDLmHCForCausalLM(config)
    with (
        torch.no_grad()
    ):  # logits of scale 10, where 20 iterations leave a visible error (naive.py's table)
        for layer in model.model.layers:
            for connection in (layer.attn_connection, layer.mlp_connection):
                connection.res_bias.copy_(torch.randn(16, generator=torch.Generator().manual_seed(2)) * 10)
    ids = torch.randint(0, 31, (8, 6), generator=torch.Generator().manual_seed(1))
    reference = first_step_reference(model, ids)
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=8,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    messages = []
    handler = logging.logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.get_logger("geoformers.training.chart_monitor")
    logger.addHandler(handler)
    trainer = Trainer(
        model=model, args=args, train_dataset=data, callbacks=[ChartViolationCallback(tolerance)]
    )
    try:
        trainer.train()
    finally:
        logger.removeHandler(handler)
    logged = [record[LOG_KEY] for record in trainer.state.log_history if LOG_KEY in record]
    assert len(logged) == 2 and 1e-3 < reference < 1.0
    assert logged[0] == pytest.approx(reference, rel=1e-4)
    assert any("Sinkhorn" in message for message in messages) == warns
    assert not charts._observers  # removed at the end of training

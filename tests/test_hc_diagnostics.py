"""Hyper-connection diagnostics (`training/hc_diagnostics.py`, docs/hc_diagnostics.md) against hand-computed
gains, entropies and saturation fractions, the model's own `output_mixing` records, a stock `Trainer` run
of the callback, and the plotting script on that run's `trainer_state.json`."""

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset
from matplotlib.image import imread
from peft import LoraConfig, TaskType, get_peft_model
from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

import geoformers
from geoformers.models.ddl_mhc.ops.charts import birkhoff
from geoformers.tokenization import build_char_tokenizer
from geoformers.training.hc_diagnostics import (
    KEY_PATTERN,
    HyperConnectionDiagnosticsCallback,
    composite_gains,
    effective_rank,
    hc_diagnostics,
    row_entropy,
    saturated_fraction,
    stream_spread,
    stream_use,
)

pytestmark = pytest.mark.usefixtures("single_thread")

LAYERS, VOCAB, STREAMS = 2, 23, 4
SUBLAYER_NAMES = [f"{layer}.{sublayer}" for layer in range(LAYERS) for sublayer in ("attn", "mlp")]
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "plot_hc_diagnostics.py"


def tiny_model(**overrides) -> geoformers.DDLmHCForCausalLM:
    torch.manual_seed(0)
    settings = dict(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        hc_streams=STREAMS,
        hc_chart="rtbp",
        residual="delta",
    )
    settings.update(overrides)
    return geoformers.DDLmHCForCausalLM(geoformers.DDLmHCConfig(**settings))


def connections(model):
    return [c for layer in model.model.layers for c in (layer.attn_connection, layer.mlp_connection)]


def randomise_maps(model, scale: float, gate: float = 0.5, seed: int = 0):
    """Chart logits of size `scale` and visible dynamic terms, so every H_res differs from the others."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for connection in connections(model):
            connection.res_bias.copy_(torch.randn(connection.res_bias.shape, generator=generator) * scale)
            connection.res_mix_logit.fill_(1.0)
            if connection.res_gate is not None:
                connection.res_gate.fill_(gate)
                connection.maps_proj.weight.normal_(generator=generator)
    return model


IDS = torch.randint(0, VOCAB, (3, 7), generator=torch.Generator().manual_seed(1))


# ----------------------------------------------------------------------------------------------
# The metrics on hand-built matrices


def test_composite_gains_of_a_hand_built_sequence():
    """A = [[1, -1], [0, 2]]: |rows| 2, 2, |columns| 1, 3. B A = [[0.5, 0.5], [1, -1]]: rows 1, 2, columns
    1.5, 1.5 (A B would give columns 2.5, 0.5: the order is H_2 H_1)."""
    a = torch.tensor([[1.0, -1.0], [0.0, 2.0]])
    b = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    forward, backward = composite_gains([a, b])
    assert forward.tolist() == [2.0, 2.0] and backward.tolist() == [3.0, 1.5]
    # Per-token matrices broadcast with static ones: token 0 sees (a, b), token 1 (identity, b).
    forward, backward = composite_gains([torch.stack([a, torch.eye(2)]), b])
    assert forward.shape == (2, 2)
    assert forward[:, 1].tolist() == [1.0, 1.0] and backward[:, 1].tolist() == [1.0, 1.5]
    with pytest.raises(ValueError, match="h_res_sequence"):
        composite_gains([])
    with pytest.raises(ValueError, match="square"):
        composite_gains([torch.ones(2, 3)])


@pytest.mark.parametrize("chart", ["tbp", "rtbp", "kromhc", "mhc_lite"])
def test_exact_charts_compose_to_gain_one(chart):
    generator = torch.Generator().manual_seed(0)
    size = {"tbp": 9, "rtbp": 9, "kromhc": 2, "mhc_lite": 24}[chart]
    logits = torch.randn(12, 5, size, generator=generator)
    forward, backward = composite_gains(list(birkhoff(logits * 3, STREAMS, chart)))
    assert forward.shape == backward.shape == (12, 5)
    assert (forward - 1).abs().max() < 1e-6 and (backward - 1).abs().max() < 1e-6


def test_sinkhorn_with_few_iterations_gains_above_one():
    """One iteration ends with a column normalisation: every product is column-stochastic (backward gain 1),
    while the rows miss 1, and as the column sums are 1 the largest row sum exceeds 1."""
    logits = torch.randn(12, 16, generator=torch.Generator().manual_seed(0)) * 3
    sequence = list(birkhoff(logits, STREAMS, "sinkhorn", iters=1))
    forward, backward = composite_gains(sequence)
    assert (backward - 1).abs().max() < 1e-5
    assert forward.min() > 1.01
    products = np.eye(STREAMS)
    for depth, h in enumerate(sequence):  # numpy reference
        products = h.double().numpy() @ products
        assert forward[depth] == pytest.approx(np.abs(products).sum(1).max(), rel=1e-12)


def test_row_entropy_of_identity_uniform_and_a_hand_matrix():
    for n in (2, 4, 7):
        assert float(row_entropy(torch.eye(n))) == 0.0
        assert float(row_entropy(torch.full((n, n), 1.0 / n))) == pytest.approx(math.log(n), rel=1e-7)
    hand = torch.tensor([[0.5, 0.5], [1.0, 0.0]])  # rows: log 2 and 0
    assert float(row_entropy(hand)) == pytest.approx(math.log(2) / 2, rel=1e-12)
    assert row_entropy(torch.stack([hand, torch.eye(2)])).tolist() == pytest.approx([math.log(2) / 2, 0.0])


def test_saturated_fraction_counts_both_ends():
    logits = torch.tensor([[-10.0, 0.0, 10.0, 4.0], [0.0, 0.0, 0.0, 0.0]])  # sigmoid(4) = 0.982
    assert saturated_fraction(logits, 0.02).tolist() == [0.75, 0.0]
    assert saturated_fraction(logits, 0.01).tolist() == [0.5, 0.0]


def test_stream_spread_and_effective_rank_of_hand_states():
    """Equal streams: spread 0, rank 1; orthogonal streams of equal norm: rank n; singular values (3, 1):
    p = (3/4, 1/4), rank exp(-(3/4) log(3/4) - (1/4) log(1/4)); the spread of streams x +- y is |y| / |x + y|
    per stream pair (docs/hc_diagnostics.md, 'Are the streams used')."""
    x = torch.randn(5, 16, dtype=torch.float64)
    equal = x[:, None, :].expand(5, 4, 16)
    assert stream_spread(equal) == 0.0
    torch.testing.assert_close(effective_rank(equal), torch.ones(5, dtype=torch.float64))
    for n in (2, 4, 7):
        orthogonal = 2.5 * torch.eye(n, 16, dtype=torch.float64)
        assert float(effective_rank(orthogonal)) == pytest.approx(n, rel=1e-12)
    hand = torch.diag(torch.tensor([3.0, 1.0], dtype=torch.float64))
    entropy = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert float(effective_rank(hand)) == pytest.approx(math.exp(entropy), rel=1e-12)
    e1, e2 = torch.eye(2, 16, dtype=torch.float64)
    pair = torch.stack([3 * e1 + e2, 3 * e1 - e2])  # mean 3 e1, deviations +-e2; ||X||^2 = 2 * 10
    assert stream_spread(pair) == pytest.approx(math.sqrt(2 / 20), rel=1e-12)
    states = torch.stack([pair, 3 * e1.expand(2, 16)])  # the second token: equal streams
    assert stream_spread(states, torch.tensor([False, True])) == 0.0
    assert stream_spread(states, torch.tensor([True, False])) == pytest.approx(math.sqrt(0.1), rel=1e-12)


def test_stream_metrics_of_a_model_equal_its_stream_states():
    model = randomise_maps(tiny_model(), scale=3.0)
    mask = torch.ones_like(IDS)
    mask[0, :3] = 0
    metrics = hc_diagnostics(model, IDS, mask)
    with torch.no_grad():
        states = model(IDS, attention_mask=mask, output_stream_states=True).stream_states
    valid = mask.bool()
    for layer in range(LAYERS):
        x = states[layer + 1].double()[valid]  # (tokens, n, d) leaving the layer
        spread = ((x - x.mean(1, keepdim=True)).square().sum() / x.square().sum()).sqrt()
        sigma = np.linalg.svd(x.numpy(), compute_uv=False)
        p = sigma / sigma.sum(-1, keepdims=True)
        rank = np.exp(-(p * np.log(p)).sum(-1)).mean()
        assert metrics[f"hc/stream_spread/{layer}.mlp"] == pytest.approx(float(spread), rel=1e-9)
        assert metrics[f"hc/stream_rank/{layer}.mlp"] == pytest.approx(float(rank), rel=1e-9)
        assert 1.0 < metrics[f"hc/stream_rank/{layer}.mlp"] < STREAMS
        assert f"hc/stream_spread/{layer}.attn" not in metrics


def test_stream_use_reduces_the_diagnostics_to_four_numbers():
    model = randomise_maps(tiny_model(), scale=3.0)
    metrics = hc_diagnostics(model, IDS)
    summary = stream_use(metrics)
    assert summary["stream_spread_last"] == metrics[f"hc/stream_spread/{LAYERS - 1}.mlp"]
    assert summary["stream_rank_last"] == metrics[f"hc/stream_rank/{LAYERS - 1}.mlp"]
    entropies = [metrics[f"hc/row_entropy/{name}"] for name in SUBLAYER_NAMES]
    assert summary["h_res_row_entropy_mean"] == pytest.approx(sum(entropies) / len(entropies), rel=1e-12)
    gains = [metrics[f"hc/gain_{d}/{name}"] for d in ("forward", "backward") for name in SUBLAYER_NAMES]
    assert summary["composite_gain_max"] == max(gains)
    with pytest.raises(ValueError, match="`metrics` must hold hc_diagnostics keys"):
        stream_use({**metrics, "loss": 1.0})
    with pytest.raises(ValueError, match="`metrics` lacks"):
        stream_use(hc_diagnostics(tiny_model(hc_streams=1), IDS))


# ----------------------------------------------------------------------------------------------
# The metrics of a model


def mixing_reference(model, ids, mask=None) -> dict[str, float]:
    """Entropy, beta and gains from the model's own `output_mixing` records, in numpy float64."""
    with torch.no_grad():
        records = model(ids, attention_mask=mask, output_mixing=True).mixing
    valid = np.ones(ids.shape, bool) if mask is None else mask.numpy().astype(bool)
    reference, product = {}, np.broadcast_to(np.eye(STREAMS), (*ids.shape, STREAMS, STREAMS))
    for name, record in zip(SUBLAYER_NAMES, records, strict=True):
        h = np.broadcast_to(record.h_res.double().numpy(), (*ids.shape, STREAMS, STREAMS))
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(h > 0, -h * np.log(h), 0.0)
        reference[f"hc/row_entropy/{name}"] = terms.sum(-1).mean(-1)[valid].mean()
        beta = np.broadcast_to(record.beta.double().numpy()[..., 0], ids.shape)
        reference[f"hc/beta/{name}"] = beta[valid].mean()
        product = h @ product
        reference[f"hc/gain_forward/{name}"] = np.abs(product).sum(-1).max(-1)[valid].max()
        reference[f"hc/gain_backward/{name}"] = np.abs(product).sum(-2).max(-1)[valid].max()
    return reference


@pytest.mark.parametrize(("chart", "dynamic"), [("rtbp", True), ("tbp", False), ("sinkhorn", True)])
def test_model_metrics_equal_the_output_mixing_reference(chart, dynamic):
    model = randomise_maps(tiny_model(hc_chart=chart, hc_dynamic=dynamic), scale=3.0)
    mask = torch.ones_like(IDS)
    mask[0, :3] = 0  # left padding: those tokens are left out
    metrics = hc_diagnostics(model, IDS, mask)
    reference = mixing_reference(model, IDS, mask)
    for key, value in reference.items():
        assert metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    for name in SUBLAYER_NAMES:
        assert metrics[f"hc/res_mix/{name}"] == pytest.approx(1 / (1 + math.exp(-1.0)), rel=1e-6)
        assert (f"hc/saturation/{name}" in metrics) == (chart != "sinkhorn")
    if chart != "sinkhorn":
        gains = [metrics[f"hc/gain_{d}/{n}"] for d in ("forward", "backward") for n in SUBLAYER_NAMES]
        assert max(abs(gain - 1) for gain in gains) < 1e-6
    assert all(KEY_PATTERN.match(key) for key in metrics)


def test_sinkhorn_model_with_large_logits_gains_above_one():
    model = randomise_maps(tiny_model(hc_chart="sinkhorn"), scale=10.0, gate=0.0)
    metrics = hc_diagnostics(model, IDS)
    assert metrics["hc/gain_forward/1.mlp"] > 1.01
    assert metrics["hc/gain_backward/1.mlp"] == pytest.approx(1.0, abs=1e-5)  # Sinkhorn ends on the columns


def test_saturation_of_a_model_is_the_fraction_of_extreme_chart_logits():
    """Static maps (gate 0): t_res = res_bias, so the fraction is the count of |logit| > logit(1 - delta)."""
    model = tiny_model(hc_chart="tbp")
    with torch.no_grad():
        for index, connection in enumerate(connections(model)):
            connection.res_gate.zero_()
            logits = torch.zeros(9)
            logits[: index + 1] = torch.tensor([8.0, -8.0, 6.0, -5.0])[: index + 1]  # 1..4 of 9 saturated
            connection.res_bias.copy_(logits)
            connection.write_bias.fill_(0.5)
            connection.write_gate.zero_()
    metrics = hc_diagnostics(model, IDS, delta=0.01)  # logit(0.99) = 4.6
    for index, name in enumerate(SUBLAYER_NAMES):
        assert metrics[f"hc/saturation/{name}"] == pytest.approx((index + 1) / 9)
        assert metrics[f"hc/beta/{name}"] == pytest.approx(2 / (1 + math.exp(-0.5)), rel=1e-6)
    assert hc_diagnostics(model, IDS, delta=0.001)["hc/saturation/1.mlp"] == pytest.approx(2 / 9)  # |t| > 6.9


def test_single_stream_model_reports_beta_only_and_modes_are_restored():
    model = tiny_model(hc_streams=1).train()
    metrics = hc_diagnostics(model, IDS)
    assert sorted(metrics) == sorted(f"hc/beta/{name}" for name in SUBLAYER_NAMES)
    assert model.training
    assert hc_diagnostics(tiny_model(hc_streams=1, residual="add"), IDS) == {}  # Llama: nothing to report


def test_peft_wrapped_model_gives_the_base_model_metrics():
    model = randomise_maps(tiny_model(), scale=2.0)
    base = hc_diagnostics(model, IDS)
    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["maps_proj", "q_proj"], task_type=TaskType.CAUSAL_LM)
    wrapped = get_peft_model(model, lora)  # LoRA B starts at 0: the same function
    assert hc_diagnostics(wrapped, IDS) == pytest.approx(base, rel=1e-6)


def test_bad_input_names_the_argument():
    model = tiny_model()
    with pytest.raises(ValueError, match="`delta`"):
        hc_diagnostics(model, IDS, delta=0.5)
    with pytest.raises(ValueError, match="`input_ids`"):
        hc_diagnostics(model, IDS[0])
    with pytest.raises(ValueError, match="`attention_mask`"):
        hc_diagnostics(model, IDS, torch.zeros_like(IDS))
    with pytest.raises(ValueError, match="`attention_mask`"):
        hc_diagnostics(model, IDS, torch.ones(3, 6))
    with pytest.raises(ValueError, match="hyper-connections"):
        hc_diagnostics(torch.nn.Linear(2, 2), IDS)
    with pytest.raises(TypeError, match="`model`"):
        hc_diagnostics("model", IDS)
    bad = [
        ({"every": 0}, "every", ValueError),
        ({"probe_size": 1.5}, "probe_size", TypeError),
        ({"delta": -1}, "delta", ValueError),
        ({"input_ids": [[1, 2]]}, "input_ids", ValueError),
        ({"attention_mask": IDS}, "attention_mask", ValueError),
    ]
    for kwargs, name, error in bad:
        with pytest.raises(error, match=f"`{name}`"):
            HyperConnectionDiagnosticsCallback(**kwargs)


def test_callback_without_probe_needs_an_indexable_training_set():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield {"input_ids": [1, 2, 3]}

    callback = HyperConnectionDiagnosticsCallback(every=1)
    loader = torch.utils.data.DataLoader(Stream(), batch_size=1)
    with pytest.raises(ValueError, match="pass `input_ids`"):
        callback.on_train_begin(None, None, None, train_dataloader=loader)


# ----------------------------------------------------------------------------------------------
# The callback in a Trainer run, and the plotting script on its output

TEXT = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer\n" * 8


@pytest.fixture(scope="module")
def diagnosed_run(tmp_path_factory):
    """6 steps, the loss logged every 4, the diagnostics every 2 (on the first 4 training blocks)."""
    tokenizer = build_char_tokenizer(TEXT)
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    blocks = Dataset.from_dict({"input_ids": [ids[i : i + 16] for i in range(0, len(ids) - 16, 16)]})
    model = randomise_maps(tiny_model(vocab_size=len(tokenizer), hc_chart="tbp"), scale=1.0)
    output_dir = tmp_path_factory.mktemp("hc_run")
    args = TrainingArguments(
        str(output_dir),
        max_steps=6,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        logging_steps=4,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    callback = HyperConnectionDiagnosticsCallback(every=2, probe_size=4)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=blocks,
        callbacks=[callback],
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
    )
    trainer.train()
    trainer.save_state()
    probe = torch.tensor(blocks["input_ids"][:4])
    return trainer, callback, probe, output_dir


def test_callback_logs_the_diagnostics_at_its_steps(diagnosed_run):
    trainer, callback, probe, _ = diagnosed_run
    assert torch.equal(callback.input_ids, probe)  # the first examples, in order, through the collator
    records = [record for record in trainer.state.log_history if "loss" in record]
    assert [record["step"] for record in records] == [2, 4, 6]  # 4 from logging_steps, 2 and 6 forced
    expected_keys = {
        f"hc/{m}/{n}"
        for m in ("row_entropy", "saturation", "beta", "res_mix", "gain_forward", "gain_backward")
        for n in SUBLAYER_NAMES
    } | {f"hc/stream_{m}/{layer}.mlp" for m in ("spread", "rank") for layer in range(LAYERS)}
    for record in records:
        assert expected_keys <= record.keys()
    assert not any(
        KEY_PATTERN.match(key)
        for record in trainer.state.log_history
        if "loss" not in record
        for key in record
    )
    # The last record is the trained model's diagnostics on the probe.
    final = hc_diagnostics(trainer.model, probe)
    assert {key: records[-1][key] for key in final} == pytest.approx(final, rel=1e-6)
    assert records[0]["hc/res_mix/0.attn"] != records[-1]["hc/res_mix/0.attn"]  # the mixing trained
    assert max(abs(records[-1][f"hc/gain_forward/{name}"] - 1) for name in SUBLAYER_NAMES) < 1e-6


def test_plot_script_writes_one_png_per_metric(diagnosed_run, tmp_path, capsys):
    _, _, _, output_dir = diagnosed_run
    spec = importlib.util.spec_from_file_location("plot_hc_diagnostics", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    paths = script.main(["--run", str(output_dir), "--output_dir", str(tmp_path)])
    names = {"row_entropy", "saturation", "beta", "res_mix", "gain_forward", "gain_backward", "stream_spread"}
    names.add("stream_rank")
    assert {path.name for path in paths} == {f"hc_{name}.png" for name in names}
    assert capsys.readouterr().out.split() == [str(path) for path in paths]
    for path in paths:
        image = imread(path)
        assert image.shape[0] > 300 and image.shape[1] > 800
        drawn = (image[..., :3] < 0.9).any(-1).mean()  # lines, text, axes and the colour bar on white
        coloured = (image[..., :3].max(-1) - image[..., :3].min(-1) > 0.3).mean()
        assert 0.01 < drawn < 0.5 and coloured > 1e-3
    state = json.loads((output_dir / "trainer_state.json").read_text())
    state["log_history"] = [{"loss": 1.0, "step": 1}]
    (tmp_path / "empty.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match="HyperConnectionDiagnosticsCallback"):
        script.main(["--run", str(tmp_path / "empty.json")])
    with pytest.raises(FileNotFoundError, match="trainer_state.json"):
        script.main(["--run", str(tmp_path / "missing")])

"""DDCL-INCRT keeps transformers' model contract: batched pipelines, batching equivalence, BERT's problem
types, standard config attributes, config edits after construction, torch.export / torch.compile."""

import pytest
import torch
import torch.nn.functional as F
from transformers import pipeline

import geoformers  # noqa: F401  (registers the Auto classes)
from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import (
    DDCLIncrtForSequenceClassification,
    DDCLIncrtModel,
)
from geoformers.tokenization import train_wordpiece

VOCAB, HIDDEN, HEAD_DIM = 40, 16, 4
STATISTICS = (
    "l_q",
    "l_ols",
    "prototype_variance",
    "temperatures",
    "min_prototype_distance",
    "prototype_perplexity",
)
TEXTS = [
    "the film was good",
    "a bad and boring film",
    "good acting",
    "the plot was bad",
    "boring",
    "a good film with good acting and a plot",
]


def small_config(**overrides):
    settings = {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": 2,
        "num_heads": [1, 2],
        "num_prototypes": 3,
        "max_position_embeddings": 16,
        "num_labels": 3,
        "hidden_dropout_prob": 0.0,
    }
    settings.update(overrides)
    return DDCLIncrtConfig(**settings)


def small_model(seed=0, cls=DDCLIncrtForSequenceClassification, **overrides):
    torch.manual_seed(seed)
    return cls(small_config(**overrides)).eval()


def padded_batch(seed=0):
    """Four rows of lengths 9, 6, 9, 3, right-padded with 0."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, VOCAB, (4, 9), generator=generator)
    attention_mask = torch.ones(4, 9, dtype=torch.long)
    for row, length in ((1, 6), (3, 3)):
        attention_mask[row, length:] = 0
        input_ids[row, length:] = 0
    return input_ids, attention_mask


# --------------------------------------------------------------------------------------------- outputs


def test_standard_outputs_are_per_example_and_statistics_need_the_flag():
    model = small_model()
    input_ids, attention_mask = padded_batch()
    output = model(
        input_ids,
        attention_mask=attention_mask,
        labels=torch.tensor([0, 1, 2, 0]),
        output_hidden_states=True,
        output_attentions=True,
    )
    assert set(output.keys()) == {"loss", "logits", "hidden_states", "attentions"}
    for tensor in (output.logits, *output.hidden_states, *output.attentions):
        assert tensor.shape[0] == 4
    encoder = model.model(input_ids, attention_mask=attention_mask)
    assert set(encoder.keys()) == {"last_hidden_state", "pooler_output"}
    with_statistics = model(input_ids, attention_mask=attention_mask, output_prototype_statistics=True)
    assert set(STATISTICS) <= set(with_statistics.keys())
    torch.testing.assert_close(with_statistics.logits, output.logits)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_batching_equivalence_each_row_equals_its_single_row_call(pooling):
    model = small_model(pooling=pooling)
    input_ids, attention_mask = padded_batch()
    batched = model(
        input_ids, attention_mask=attention_mask, output_hidden_states=True, output_attentions=True
    )
    for row in range(4):
        length = int(attention_mask[row].sum())
        single = model(input_ids[row : row + 1, :length], output_hidden_states=True, output_attentions=True)
        torch.testing.assert_close(batched.logits[row : row + 1], single.logits, atol=1e-6, rtol=1e-5)
        for ours, theirs in zip(batched.hidden_states, single.hidden_states, strict=True):
            torch.testing.assert_close(ours[row : row + 1, :length], theirs, atol=1e-5, rtol=1e-5)
        for ours, theirs in zip(batched.attentions, single.attentions, strict=True):
            torch.testing.assert_close(ours[row : row + 1, :, :length, :length], theirs, atol=1e-6, rtol=1e-5)
            assert ours[row, :, :, length:].abs().sum() == 0  # no attention to padding


@pytest.fixture(scope="module")
def tokenizer():
    return train_wordpiece(TEXTS, vocab_size=60, min_frequency=1)


def pipeline_model(tokenizer, **overrides):
    torch.manual_seed(0)
    config = small_config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        max_position_embeddings=32,
        **overrides,
    )
    return DDCLIncrtForSequenceClassification(config).eval()


def test_text_classification_pipeline_with_batch_size_4(tokenizer):
    model = pipeline_model(tokenizer, id2label={0: "neg", 1: "neutral", 2: "pos"})
    classifier = pipeline("text-classification", model=model, tokenizer=tokenizer, batch_size=4)
    results = classifier(TEXTS)
    assert len(results) == len(TEXTS)
    for text, result in zip(TEXTS, results, strict=True):
        with torch.no_grad():
            probabilities = model(**tokenizer(text, return_tensors="pt")).logits.softmax(-1)[0]
        best = int(probabilities.argmax())
        assert result["label"] == model.config.id2label[best]
        assert result["score"] == pytest.approx(float(probabilities[best]), rel=1e-5)


def test_feature_extraction_pipeline_with_batch_size_4(tokenizer):
    torch.manual_seed(0)
    config = small_config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    encoder = DDCLIncrtModel(config).eval()
    extractor = pipeline("feature-extraction", model=encoder, tokenizer=tokenizer, batch_size=4)
    features = extractor(TEXTS)
    for text, feature in zip(TEXTS, features, strict=True):
        expected = encoder(**tokenizer(text, return_tensors="pt")).last_hidden_state
        length = expected.shape[1]  # the batch's padding stays in the features, as for every encoder
        torch.testing.assert_close(torch.tensor(feature)[:, :length], expected, atol=1e-5, rtol=1e-5)


def test_zero_shot_classification_pipeline_with_batch_size_4(tokenizer):
    names = ["contradiction", "neutral", "entailment"]
    model = pipeline_model(
        tokenizer, id2label=dict(enumerate(names)), label2id={name: index for index, name in enumerate(names)}
    )
    classifier = pipeline("zero-shot-classification", model=model, tokenizer=tokenizer, batch_size=4)
    labels = ["good", "bad", "boring"]
    results = classifier(TEXTS[:3], candidate_labels=labels)
    assert len(results) == 3
    for text, result in zip(TEXTS[:3], results, strict=True):
        pairs = tokenizer(
            [text] * 3, [f"This example is {label}." for label in labels], padding=True, return_tensors="pt"
        )
        entailment = model(**pairs).logits[:, 2].softmax(0)
        expected = dict(zip(labels, entailment.tolist(), strict=True))
        assert result["scores"] == pytest.approx([expected[label] for label in result["labels"]], rel=1e-4)


# --------------------------------------------------------------------------------------------- problem types


def statistics_free_loss(model, inputs, labels):
    """The model's loss minus lambda * L_q (taken from the same call's statistics)."""
    output = model(**inputs, labels=labels, output_prototype_statistics=True)
    return output.loss - model.config.prototype_loss_weight * output.l_q, output.logits


def test_num_labels_one_is_mse_regression():
    model = small_model(num_labels=1, prototype_loss_weight=0.3)
    input_ids, attention_mask = padded_batch()
    targets = torch.tensor([0.5, -1.0, 2.0, 0.0])
    for labels in (targets, targets[:, None], torch.tensor([1, 0, 2, 0])):
        task, logits = statistics_free_loss(
            model, {"input_ids": input_ids, "attention_mask": attention_mask}, labels
        )
        expected = ((logits[:, 0] - labels.reshape(-1).float()) ** 2).mean()
        torch.testing.assert_close(task, expected, rtol=1e-5, atol=1e-6)
    assert model.config.problem_type is None  # inferred per call, the config is not edited


def test_multi_label_classification_is_bce_with_logits():
    model = small_model(problem_type="multi_label_classification")
    input_ids, attention_mask = padded_batch()
    labels = torch.tensor([[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]])
    for given in (labels.float(), labels.bool()):
        task, logits = statistics_free_loss(
            model, {"input_ids": input_ids, "attention_mask": attention_mask}, given
        )
        probabilities = torch.sigmoid(logits.double())
        expected = -(labels * probabilities.log() + (1 - labels) * (1 - probabilities).log()).mean()
        torch.testing.assert_close(task.double(), expected, rtol=1e-5, atol=1e-6)
    # float labels without a problem type choose BCE too, as BertForSequenceClassification does
    plain = small_model()
    plain_task, _ = statistics_free_loss(
        plain, {"input_ids": input_ids, "attention_mask": attention_mask}, labels.float()
    )
    torch.testing.assert_close(
        plain_task,
        F.binary_cross_entropy_with_logits(
            plain(input_ids, attention_mask=attention_mask).logits, labels.float()
        ),
    )


def test_cross_entropy_ignores_minus_100_and_is_zero_when_every_label_is_ignored():
    model = small_model()
    input_ids, attention_mask = padded_batch()
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    task, logits = statistics_free_loss(model, inputs, torch.tensor([2, -100, 0, -100]))
    log_probabilities = logits.log_softmax(-1)
    expected = -(log_probabilities[0, 2] + log_probabilities[2, 0]) / 2
    torch.testing.assert_close(task, expected)
    output = model(**inputs, labels=torch.full((4,), -100), output_prototype_statistics=True)
    assert torch.isfinite(output.loss)
    torch.testing.assert_close(output.loss, model.config.prototype_loss_weight * output.l_q)


@pytest.mark.parametrize(
    ("overrides", "labels", "message"),
    [
        ({"num_labels": 1}, torch.ones(4, 2), r"\(4, 1\) or \(4,\)"),
        ({"num_labels": 1}, torch.tensor([0.0, float("nan"), 1.0, 2.0]), "finite"),
        ({"problem_type": "multi_label_classification"}, torch.ones(4), r"\(4, 3\)"),
        ({"problem_type": "multi_label_classification"}, torch.full((4, 3), 2.0), r"\[0, 1\]"),
        ({"problem_type": "single_label_classification"}, torch.ones(4, 3), "integer"),
        ({}, torch.tensor([0, 1, 2, -5]), "-100"),
        ({}, torch.zeros(0, dtype=torch.long), r"shape \(4,\)"),
        ({}, [0, 1, 2, 0], "torch.Tensor"),
    ],
)
def test_bad_labels_name_the_argument(overrides, labels, message):
    model = small_model(**overrides)
    with pytest.raises((ValueError, TypeError), match=f"`labels`.*{message}|{message}.*`labels`"):
        model(padded_batch()[0], labels=labels)


# --------------------------------------------------------------------------------------------- config


def test_num_attention_heads_reads_and_sets_the_per_layer_counts(tmp_path):
    config = small_config(num_heads=[1, 3])
    assert config.num_attention_heads == 3  # the widest layer
    config.num_attention_heads = 2
    assert config.num_heads == [2, 2]
    assert small_config(num_heads=None, num_attention_heads=3).num_heads == [3, 3]
    config.num_heads = 1  # an int assigned later is expanded as in the constructor
    assert config.num_heads == [1, 1]
    config.save_pretrained(tmp_path)
    assert "num_attention_heads" not in (tmp_path / "config.json").read_text()
    model = small_model(num_heads=2)
    output = model(padded_batch()[0], output_attentions=True)
    assert all(a.shape[1] == model.config.num_attention_heads for a in output.attentions)


def test_tau_init_800_builds_and_the_temperatures_are_800():
    model = small_model(tau_init=800.0)
    temperatures = model(padded_batch()[0], output_prototype_statistics=True).temperatures
    for layer_temperatures in temperatures:
        torch.testing.assert_close(layer_temperatures, torch.full_like(layer_temperatures, 800.0))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("pooling", "max", "pooling"),
        ("hidden_size", 0, "hidden_size"),
        ("tau_min", 0.0, "tau_min"),
        ("num_heads", ["2"], "num_heads"),
    ],
)
def test_an_assigned_value_of_the_wrong_type_or_range_is_refused_and_not_stored(field, value, message):
    config = small_config(max_heads=4)
    before = config.to_dict()
    with pytest.raises((ValueError, TypeError), match=message):
        setattr(config, field, value)
    assert config.to_dict() == before


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_heads", [5, 1], r"num_heads\[0\]"),
        ("num_hidden_layers", 3, "num_heads"),
        ("tau_init", 0.01, "tau_init"),
    ],
)
def test_an_assignment_that_breaks_agreement_is_refused_and_undone(tmp_path, field, value, message):
    """Fields that must agree change together, in one `update`; the config stays buildable and saveable."""
    config = small_config(max_heads=4)
    before = config.to_dict()
    with pytest.raises(ValueError, match=message):
        setattr(config, field, value)
    assert config.to_dict() == before
    DDCLIncrtForSequenceClassification(config)
    config.save_pretrained(tmp_path)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("hidden_size", 15, "hidden_size"),
        ("num_heads", [1, 3], "num_heads"),
        ("num_prototypes", 4, "num_prototypes"),
    ],
)
def test_fields_assigned_after_build_are_refused_by_forward(field, value, message):
    model = small_model()
    setattr(model.config, field, value)
    with pytest.raises(ValueError, match=message):
        model(padded_batch()[0])


# ------------------------------------------------------------------------------------------ export, compile


def test_forward_reads_no_tensor_values_off_cpu():
    """On the meta device (a stand-in for an accelerator: reading a value raises there) the forward runs,
    so it forces no host sync; the value checks run on CPU only."""
    model = small_model().to("meta")
    input_ids, attention_mask = padded_batch()
    output = model(
        input_ids.to("meta"),
        attention_mask=attention_mask.to("meta"),
        labels=torch.tensor([0, 1, 2, 0], device="meta"),
        output_hidden_states=True,
        output_prototype_statistics=True,
    )
    assert output.logits.shape == (4, 3) and output.loss.shape == ()


def test_frozen_bert_forward_reads_no_tensor_values_off_cpu():
    """The same with the frozen BERT encoder of the pruning-safety experiment (`bert_config`): its mask is
    built without transformers' all-ones skip, which reads the mask's values."""
    bert = {"model_type": "bert", "hidden_size": HIDDEN, "num_attention_heads": 2, "num_hidden_layers": 1}
    model = small_model(bert_config=bert).to("meta")
    input_ids, attention_mask = padded_batch()
    output = model(input_ids.to("meta"), attention_mask=attention_mask.to("meta"))
    assert output.logits.shape == (4, 3)


def test_torch_export_gives_the_eager_logits():
    model = small_model()
    input_ids, attention_mask = padded_batch()
    program = torch.export.export(model, (input_ids,), {"attention_mask": attention_mask})
    exported = program.module()(input_ids, attention_mask=attention_mask)
    torch.testing.assert_close(exported.logits, model(input_ids, attention_mask=attention_mask).logits)


@pytest.mark.parametrize(
    ("backend", "implementation"),
    [
        ("eager", "sdpa"),
        ("eager", "eager"),
        pytest.param("inductor", "sdpa", marks=pytest.mark.slow),
        pytest.param("inductor", "eager", marks=pytest.mark.slow),
    ],
)
def test_full_graph_compile_gives_the_eager_logits_loss_and_gradients(backend, implementation):
    """fullgraph=True fails on any graph break (a value check, a host read, output capture); "eager" checks
    the capture alone, "inductor" the generated code too. `_can_compile_fullgraph` rests on this test."""
    assert DDCLIncrtForSequenceClassification._can_compile_fullgraph
    torch._dynamo.reset()
    model = small_model(classifier_dropout=0.0).train()  # train mode (backward), no randomness
    model.set_attn_implementation(implementation)
    input_ids, attention_mask = padded_batch()
    labels = torch.tensor([0, 1, 2, 0])
    inputs = {"attention_mask": attention_mask, "labels": labels, "output_prototype_statistics": True}
    # recorded by transformers' output-capture hooks, which the first eager call with an output flag installs
    # (installing them takes a lock, which dynamo cannot trace: transformers' limitation, Llama's too)
    inputs["output_hidden_states"] = True
    eager = model(input_ids, **inputs)
    eager.loss.backward()
    eager_gradients = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    ours = compiled(input_ids, **inputs)
    ours.loss.backward()
    torch.testing.assert_close(ours.logits, eager.logits)
    torch.testing.assert_close(ours.loss, eager.loss)
    torch.testing.assert_close(ours.l_q, eager.l_q)
    assert len(ours.hidden_states) == 3
    for compiled_state, state in zip(ours.hidden_states, eager.hidden_states, strict=True):
        torch.testing.assert_close(compiled_state, state)
    for eager_gradient, parameter in zip(eager_gradients, model.parameters(), strict=True):
        torch.testing.assert_close(parameter.grad, eager_gradient, atol=1e-6, rtol=1e-4)


def test_full_graph_compiled_model_follows_growth_and_pruning():
    """Growth and pruning change parameter shapes and module lists: the compiled model recompiles (a guard
    failure, no graph break) and gives the eager logits of the edited model."""
    torch._dynamo.reset()
    model = small_model()
    input_ids, attention_mask = padded_batch()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    compiled(input_ids, attention_mask=attention_mask)
    head = model.grow_head(0, torch.randn(HIDDEN))
    with torch.no_grad():
        head.o_proj.weight.normal_()  # the grown head contributes: stale compiled code would show
    grown = compiled(input_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(
        grown, model(input_ids, attention_mask=attention_mask).logits, rtol=0, atol=1e-6
    )
    model.prune_head(1, 0)
    pruned = compiled(input_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(
        pruned, model(input_ids, attention_mask=attention_mask).logits, rtol=0, atol=1e-6
    )
    assert not torch.allclose(grown, pruned)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to detect host syncs")
def test_cuda_forward_and_backward_force_no_host_sync():
    model = small_model().cuda().train()
    input_ids, attention_mask = (t.cuda() for t in padded_batch())
    labels = torch.tensor([0, 1, 2, 0], device="cuda")
    model(input_ids, attention_mask=attention_mask, labels=labels).loss.backward()  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model(input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")

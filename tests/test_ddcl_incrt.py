"""DDCL-INCRT encoder: config validation, forward against an fp64 reference, growth API, checkpoints, gate."""

import math
import time

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

import geoformers  # noqa: F401  (registers the Auto classes)
from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import (
    DDCLIncrtForSequenceClassification,
    DDCLIncrtModel,
)

VOCAB, HIDDEN, HEAD_DIM = 40, 16, 4


def small_config(**overrides):
    settings = {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": 2,
        "num_heads": [1, 2],
        "num_prototypes": 3,
        "max_position_embeddings": 12,
        "num_labels": 3,
    }
    settings.update(overrides)
    return DDCLIncrtConfig(**settings)


def small_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return DDCLIncrtForSequenceClassification(small_config(**overrides)).eval()


def batch(seed=0, size=3, length=9):
    """Random ids; the second sequence (when there is one) is right-padded after 6 tokens."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, VOCAB, (size, length), generator=generator)
    attention_mask = torch.ones(size, length, dtype=torch.long)
    attention_mask[1:2, 6:] = 0
    input_ids[1:2, 6:] = 0
    return input_ids, attention_mask


def reference_forward(model, input_ids, attention_mask):
    """Independent fp64 forward: per-head loops and explicit o - p_k differences -> (logits, mean L_q)."""
    parameters = {name: p.detach().double() for name, p in model.named_parameters()}
    config = model.config

    def layer_norm(x, prefix):
        return F.layer_norm(
            x, (HIDDEN,), parameters[f"{prefix}.weight"], parameters[f"{prefix}.bias"], config.layer_norm_eps
        )

    length = input_ids.shape[1]
    x = parameters["model.embeddings.word_embeddings.weight"][input_ids]
    x = x + parameters["model.embeddings.position_embeddings.weight"][:length]
    x = x + parameters["model.embeddings.token_type_embeddings.weight"][0]
    x = layer_norm(x, "model.embeddings.LayerNorm")
    keep = attention_mask.bool()
    l_q_per_layer = []
    for layer, num_heads in enumerate(config.num_heads):
        update = torch.zeros_like(x)
        l_q_heads = []
        for head in range(num_heads):
            prefix = f"model.layers.{layer}.attention.heads.{head}"

            query, key, value = (
                x @ parameters[f"{prefix}.{name}.weight"].T + parameters[f"{prefix}.{name}.bias"]
                for name in ("q_proj", "k_proj", "v_proj")
            )
            scores = query @ key.transpose(1, 2) / math.sqrt(HEAD_DIM)
            scores = scores.masked_fill(~keep[:, None, :], -math.inf)
            o = torch.softmax(scores, -1) @ value
            prototypes = parameters[f"{prefix}.prototype_bank.prototypes"]
            tau = config.tau_min + F.softplus(parameters[f"{prefix}.prototype_bank.rho"])
            distances = (o[:, :, None, :] - prototypes).pow(2).sum(-1)
            q = torch.softmax(-distances / tau, -1)
            l_q_heads.append(((q * distances).sum(-1) * keep).sum() / keep.sum())
            update = update + (q @ prototypes) @ parameters[f"{prefix}.o_proj.weight"].T
        x = layer_norm(x + update, f"model.layers.{layer}.LayerNorm")
        l_q_per_layer.append(torch.stack(l_q_heads).mean())
    logits = x[:, 0] @ parameters["classifier.weight"].T + parameters["classifier.bias"]
    return logits, torch.stack(l_q_per_layer).mean()


# --------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("overrides", "field", "error"),
    [
        ({"num_heads": [1, 1, 1]}, "num_heads", ValueError),
        ({"num_heads": [1, 0]}, r"num_heads\[1\]", ValueError),
        ({"num_heads": [1, 5]}, r"num_heads\[1\]", ValueError),
        ({"num_heads": "2"}, "num_heads", TypeError),
        ({"max_heads": 0}, "max_heads", ValueError),
        ({"tau_min": 0.0}, "tau_min", ValueError),
        ({"tau_min": 0.5, "tau_init": 0.5}, "tau_init", ValueError),
        ({"num_prototypes": 1}, "num_prototypes", ValueError),
        ({"pooling": "max"}, "pooling", TypeError),
        ({"prototype_loss_weight": -1.0}, "prototype_loss_weight", ValueError),
        ({"classifier_dropout": 1.0}, "classifier_dropout", ValueError),
        ({"head_dim": 32}, "head_dim", ValueError),
        ({"hidden_size": 16.0}, "hidden_size", TypeError),
        ({"gate_theta_w": 0.0}, "gate_theta_w", ValueError),
        ({"gate_oja_step": 1.5}, "gate_oja_step", ValueError),
        ({"gate_mca_step": 0.0}, "gate_mca_step", ValueError),
        ({"gate_prune_patience": 0}, "gate_prune_patience", ValueError),
        ({"gate_calibration_factor": float("nan")}, "gate_calibration_factor", ValueError),
        ({"num_labels": 0}, "num_labels", ValueError),
        ({"problem_type": "ranking"}, "problem_type", TypeError),
        ({"num_labels": 1, "problem_type": "single_label_classification"}, "single_label", ValueError),
        ({"pad_token_id": VOCAB}, "pad_token_id", ValueError),
        ({"tau_min": 1e-300}, "tau_min", ValueError),
        ({"tau_init": 1e31}, "tau_init", ValueError),
        ({"initializer_range": 1e300}, "initializer_range", ValueError),
        ({"layer_norm_eps": 1e-300}, "layer_norm_eps", ValueError),
        ({"id2label": ["a", "b"]}, "id2label", TypeError),
        ({"id2label": {0: 1, 1: 2}}, "id2label", TypeError),
        ({"id2label": {0: "a", 2: "b"}}, "id2label", ValueError),
        ({"label2id": 5}, "label2id", TypeError),
        ({"eos_token_id": "x"}, "eos_token_id", TypeError),
        ({"bos_token_id": VOCAB}, "bos_token_id", ValueError),
        ({"sep_token_id": -3}, "sep_token_id", ValueError),
        ({"num_attention_heads": 2}, "num_attention_heads", ValueError),
        # size ceilings as in DDL-mHC: refused at once, before any per-layer list is built
        ({"num_hidden_layers": 10**6, "num_heads": 1}, "num_hidden_layers", ValueError),
        ({"num_prototypes": 18_000_000_000}, "num_prototypes", ValueError),
        ({"bert_config": {"hidden_size": "x"}}, "bert_config", TypeError),
        ({"bert_config": {"hidden_size": 8}}, r"bert_config\['hidden_size'\]", ValueError),
        ({"bert_config": {"model_type": "gpt2"}}, "bert_config", ValueError),
    ],
)
def test_bad_config_names_the_field(overrides, field, error):
    with pytest.raises(error, match=field):
        small_config(**overrides)


def test_size_ceilings_answer_at_once():
    start = time.perf_counter()
    for overrides in ({"num_hidden_layers": 10**6, "num_heads": 1}, {"num_prototypes": 18_000_000_000}):
        with pytest.raises(ValueError, match="Value must be greater or equal to .* and smaller or equal to"):
            small_config(**overrides)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize(
    ("overrides", "problem_type"),
    [({"problem_type": "regression"}, "regression"), ({}, None)],
)
def test_num_labels_one_is_accepted_as_transformers_accepts_it(tmp_path, overrides, problem_type):
    config = small_config(num_labels=1, **overrides)
    assert (config.num_labels, config.problem_type) == (1, problem_type)
    config.save_pretrained(tmp_path)
    loaded = DDCLIncrtConfig.from_pretrained(tmp_path)
    assert (loaded.num_labels, loaded.problem_type) == (1, problem_type)
    config.problem_type = "single_label_classification"  # transformers refuses it at construction only
    config.validate()
    DDCLIncrtForSequenceClassification(config)


def test_label2id_with_string_ids_as_transformers_types_it(tmp_path):
    config = small_config(num_labels=1, id2label={0: "label"}, label2id={"label": "0"})
    config.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).label2id == {"label": "0"}


def test_config_defaults_expansion_and_json_round_trip(tmp_path):
    config = small_config(num_heads=2, max_heads=None)
    assert config.num_heads == [2, 2] and config.max_heads == HIDDEN // HEAD_DIM
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, DDCLIncrtConfig)
    assert loaded.num_heads == [2, 2] and loaded.num_labels == 3 and loaded.max_heads == 4


def test_auto_classes_are_registered():
    config = small_config()
    assert isinstance(AutoConfig.for_model("ddcl_incrt"), DDCLIncrtConfig)
    assert type(AutoModel.from_config(config)) is DDCLIncrtModel
    assert type(AutoModelForSequenceClassification.from_config(config)) is DDCLIncrtForSequenceClassification


# --------------------------------------------------------------------------------------------- forward


def test_forward_matches_float64_reference_and_loss_is_ce_plus_lambda_lq():
    model = small_model(seed=1, prototype_loss_weight=0.3).double()
    input_ids, attention_mask = batch()
    labels = torch.tensor([0, 2, 1])
    output = model(input_ids, attention_mask=attention_mask, labels=labels, output_prototype_statistics=True)
    logits, l_q = reference_forward(model, input_ids, attention_mask)
    torch.testing.assert_close(output.logits, logits, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(output.l_q, l_q, rtol=1e-9, atol=1e-12)
    expected_loss = F.cross_entropy(logits, labels) + 0.3 * l_q
    torch.testing.assert_close(output.loss, expected_loss, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(output.l_q, output.l_ols + output.prototype_variance, rtol=1e-9, atol=1e-12)


def test_auxiliary_outputs_attentions_and_hidden_states():
    model = small_model()
    input_ids, attention_mask = batch()
    output = model(
        input_ids,
        attention_mask=attention_mask,
        output_attentions=True,
        output_hidden_states=True,
        output_prototype_statistics=True,
    )
    assert [t.shape for t in output.temperatures] == [(1,), (2,)]
    torch.testing.assert_close(output.temperatures[1], torch.full((2,), model.config.tau_init))
    for layer, num_heads in enumerate(model.config.num_heads):
        heads = model.model.layers[layer].attention.heads
        prototypes = torch.stack([h.prototype_bank.prototypes for h in heads])
        expected = torch.cdist(prototypes, prototypes) + torch.eye(3) * 1e9
        torch.testing.assert_close(output.min_prototype_distance[layer], expected.amin(dim=(1, 2)))
        perplexity = output.prototype_perplexity[layer]
        assert perplexity.shape == (num_heads,) and ((perplexity >= 1) & (perplexity <= 3 + 1e-5)).all()
        probs = output.attentions[layer]
        assert probs.shape == (3, num_heads, 9, 9)
        torch.testing.assert_close(probs.sum(-1), torch.ones(3, num_heads, 9))
        assert probs[1, :, :, 6:].abs().max() == 0  # padding keys get no attention
    assert len(output.hidden_states) == 3
    # the explicit-softmax path equals the SDPA path
    torch.testing.assert_close(model(input_ids, attention_mask=attention_mask).logits, output.logits)


def _ran_sdpa(model, *args, **kwargs):
    """The model's output and whether torch's scaled_dot_product_attention op ran in its forward."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        output = model(*args, **kwargs)
    return output, any(event.name == "aten::scaled_dot_product_attention" for event in profile.events())


def test_sdpa_is_the_default_and_eager_is_available_by_attn_implementation():
    model = small_model()
    input_ids, attention_mask = batch()
    assert model.config._attn_implementation == "sdpa"
    assert _ran_sdpa(model, input_ids, attention_mask=attention_mask)[1]
    eager = AutoModelForSequenceClassification.from_config(small_config(), attn_implementation="eager")
    assert eager.config._attn_implementation == "eager"
    assert not _ran_sdpa(eager, input_ids, attention_mask=attention_mask)[1]
    with pytest.raises(ValueError, match="does not support Flash Attention 2"):  # not claimed
        AutoModelForSequenceClassification.from_config(
            small_config(), attn_implementation="flash_attention_2"
        )


@pytest.mark.parametrize("masked", [True, False])
def test_sdpa_equals_eager_in_outputs_statistics_and_gradients(masked):
    """fp32, train mode (dropout 0): the two implementations agree to float rounding in every output, in the
    DDCL statistics and in every parameter gradient; with `output_attentions` "sdpa" runs eager."""
    settings = {"hidden_dropout_prob": 0.0, "classifier_dropout": 0.0}
    input_ids, attention_mask = batch()
    attention_mask = attention_mask if masked else None
    labels = torch.tensor([0, 2, 1])
    results = {}
    for implementation in ("sdpa", "eager"):
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_config(
            small_config(**settings), attn_implementation=implementation
        )
        model.train()
        output = model(
            input_ids,
            attention_mask=attention_mask,
            labels=labels,
            output_hidden_states=True,
            output_prototype_statistics=True,
        )
        output.loss.backward()
        gradients = {name: p.grad for name, p in model.named_parameters()}
        model.eval()
        with_attentions, ran_sdpa = _ran_sdpa(
            model, input_ids, attention_mask=attention_mask, output_attentions=True
        )
        assert not ran_sdpa  # attention probabilities come from the eager function under either setting
        results[implementation] = output, gradients, with_attentions
    (sdpa, sdpa_gradients, sdpa_attentions), (eager, eager_gradients, eager_attentions) = results.values()
    for name in ("loss", "logits", "l_q", "l_ols", "prototype_variance"):
        torch.testing.assert_close(sdpa[name], eager[name], rtol=1e-5, atol=1e-6, msg=name)
    for name in ("hidden_states", "temperatures", "min_prototype_distance", "prototype_perplexity"):
        for ours, theirs in zip(sdpa[name], eager[name], strict=True):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=name)
    assert sdpa_gradients.keys() == eager_gradients.keys()
    for name, gradient in sdpa_gradients.items():
        torch.testing.assert_close(gradient, eager_gradients[name], rtol=1e-4, atol=1e-6, msg=name)
    for ours, theirs in zip(sdpa_attentions.attentions, eager_attentions.attentions, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    torch.testing.assert_close(sdpa_attentions.logits, eager_attentions.logits, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_growth_and_pruning_are_function_preserving_under_each_attention_implementation(implementation):
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(
        small_config(), attn_implementation=implementation
    ).eval()
    input_ids, attention_mask = batch()
    before = model(input_ids, attention_mask=attention_mask).logits
    model.grow_head(0, torch.randn(HIDDEN))
    model.grow_head(1)
    grown, ran_sdpa = _ran_sdpa(model, input_ids, attention_mask=attention_mask)
    assert ran_sdpa == (implementation == "sdpa")
    torch.testing.assert_close(grown.logits, before, rtol=0, atol=1e-6)
    model.prune_head(1, 2)  # the grown head: its contribution was zero
    torch.testing.assert_close(
        model(input_ids, attention_mask=attention_mask).logits, before, rtol=0, atol=1e-6
    )


def test_hidden_states_and_attentions_are_recorded_by_transformers_output_capture():
    """`capture_outputs` hooks: hidden_states are the first layer's input and each layer's output (recomputed
    here by calling the modules), attentions the softmax rows; the config flags and index selection work."""
    model = small_model()
    input_ids, attention_mask = batch()
    encoder = model.model
    output = encoder(
        input_ids, attention_mask=attention_mask, output_hidden_states=True, output_attentions=True
    )
    with torch.no_grad():
        states = [encoder.embeddings(input_ids, None, None)]
        mask = attention_mask.bool()[:, None, None, :].expand(-1, 1, 9, -1)
        for layer in encoder.layers:
            states.append(layer(states[-1], attention_mask=mask)[0])
    assert len(output.hidden_states) == 3 and len(output.attentions) == 2
    for recorded, expected in zip(output.hidden_states, states, strict=True):
        torch.testing.assert_close(recorded, expected, rtol=0, atol=1e-6)
    assert output.hidden_states[-1] is output.last_hidden_state
    for probabilities, heads in zip(output.attentions, model.config.num_heads, strict=True):
        assert probabilities.shape == (3, heads, 9, 9)
        torch.testing.assert_close(probabilities.sum(-1), torch.ones(3, heads, 9))
    selected = encoder(input_ids, attention_mask=attention_mask, output_hidden_states=[0, -1])
    assert selected.hidden_states[1] is None
    torch.testing.assert_close(selected.hidden_states[0], states[0], rtol=0, atol=0)
    torch.testing.assert_close(selected.hidden_states[2], states[2], rtol=0, atol=1e-6)
    plain = model(input_ids, attention_mask=attention_mask)
    assert plain.hidden_states is None and plain.attentions is None
    model.config.output_hidden_states = True  # transformers refuses config.output_attentions under "sdpa"
    assert len(model(input_ids, attention_mask=attention_mask).hidden_states) == 3
    model.set_attn_implementation("eager")
    model.config.output_attentions = True
    flagged = model(input_ids, attention_mask=attention_mask)
    assert len(flagged.attentions) == 2
    assert model(input_ids, attention_mask=attention_mask, output_attentions=False).attentions is None


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_right_padding_does_not_change_the_result(pooling):
    model = small_model(pooling=pooling)
    input_ids, _ = batch(size=1, length=6)
    padded = torch.cat([input_ids, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    mask = torch.tensor([[1] * 6 + [0] * 3])
    alone = model(input_ids, output_prototype_statistics=True)
    with_padding = model(padded, attention_mask=mask, output_prototype_statistics=True)
    torch.testing.assert_close(with_padding.logits, alone.logits, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(with_padding.l_q, alone.l_q, atol=1e-6, rtol=1e-5)


def test_inputs_embeds_equal_input_ids_and_return_dict_false():
    model = small_model()
    input_ids, attention_mask = batch()
    embeds = model.model.embeddings.word_embeddings(input_ids)
    from_ids = model(input_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(model(inputs_embeds=embeds, attention_mask=attention_mask).logits, from_ids)
    labels = torch.tensor([0, 1, 2])
    as_tuple = model(input_ids, attention_mask=attention_mask, labels=labels, return_dict=False)
    assert isinstance(as_tuple, tuple) and as_tuple[0].dim() == 0 and torch.equal(as_tuple[1], from_ids)


def test_bfloat16_autocast_forward_is_finite():
    model = small_model()
    input_ids, attention_mask = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = model(
            input_ids,
            attention_mask=attention_mask,
            labels=torch.tensor([0, 1, 2]),
            output_prototype_statistics=True,
        )
    assert torch.isfinite(output.loss) and output.l_q.dtype == torch.float32


IDS = torch.ones(2, 4, dtype=torch.long)


@pytest.mark.parametrize(
    ("kwargs", "message", "error"),
    [
        ({"input_ids": torch.tensor([[1, VOCAB]])}, "input_ids", ValueError),
        ({"input_ids": torch.tensor([[1, -1]])}, "input_ids", ValueError),
        ({"input_ids": torch.tensor([[1.0, 2.0]])}, "input_ids", TypeError),
        ({"input_ids": torch.ones(1, 13, dtype=torch.long)}, "max_position_embeddings", ValueError),
        ({"input_ids": IDS, "attention_mask": torch.ones(2, 5)}, "attention_mask", ValueError),
        ({"input_ids": IDS, "attention_mask": torch.full((2, 4), 2)}, "attention_mask", ValueError),
        (
            {"input_ids": IDS, "attention_mask": torch.tensor([[1, 1, 0, 0], [0] * 4])},
            "attention_mask",
            ValueError,
        ),
        ({"input_ids": IDS, "attention_mask": torch.tensor([[0, 1, 1, 1]] * 2)}, "pooling", ValueError),
        ({"input_ids": IDS, "token_type_ids": torch.full((2, 4), 2)}, "token_type_ids", ValueError),
        ({"inputs_embeds": torch.zeros(1, 4, HIDDEN + 1)}, "inputs_embeds", ValueError),
        ({}, "input_ids", ValueError),
        ({"input_ids": IDS, "labels": torch.tensor([0, 3])}, "labels", ValueError),
        ({"input_ids": IDS, "labels": torch.tensor([0.0, 1.0])}, "labels", ValueError),
    ],
)
def test_bad_inputs_name_the_argument(kwargs, message, error):
    with pytest.raises(error, match=message):
        small_model()(**kwargs)


# --------------------------------------------------------------------------------------------- growth API


def test_growth_is_function_preserving_and_the_new_head_learns():
    model = small_model()
    input_ids, attention_mask = batch()
    before = model(input_ids, attention_mask=attention_mask).logits
    head = model.grow_head(0)
    assert model.config.num_heads == [2, 2] and len(model.model.layers[0].attention.heads) == 2
    after = model(input_ids, attention_mask=attention_mask, labels=torch.tensor([0, 1, 2]))
    torch.testing.assert_close(after.logits, before, atol=1e-6, rtol=0)
    after.loss.backward()
    assert head.o_proj.weight.grad.abs().sum() > 0
    assert head.prototype_bank.prototypes.grad.abs().sum() > 0  # through lambda * L_q


def _gradients_and_layer_calls(model, input_ids, attention_mask, labels):
    """Parameter gradients of one training step (dropout seeded) and how often each layer's attention ran."""
    calls = []
    layers = model.model.layers
    hooks = [layer.attention.register_forward_hook(lambda *_: calls.append(1)) for layer in layers]
    model.zero_grad()
    torch.manual_seed(5)
    model(input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
    for hook in hooks:
        hook.remove()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}, len(calls)


def test_activation_checkpointing_recomputes_the_layers_and_gives_the_plain_gradients():
    """fp64, dropout on: the recomputed layers reuse the saved RNG state, so gradients agree to rounding."""
    model = small_model(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1).double().train()
    input_ids, attention_mask = batch()
    labels = torch.tensor([0, 1, 2])
    plain, plain_calls = _gradients_and_layer_calls(model, input_ids, attention_mask, labels)
    model.activation_checkpointing_enable()
    assert model.is_activation_checkpointing
    checkpointed, checkpointed_calls = _gradients_and_layer_calls(model, input_ids, attention_mask, labels)
    assert (plain_calls, checkpointed_calls) == (2, 4)  # each layer runs again in the backward
    assert plain.keys() == checkpointed.keys() and len(plain) == len(list(model.parameters()))
    for name, gradient in plain.items():
        torch.testing.assert_close(checkpointed[name], gradient, rtol=1e-12, atol=1e-14, msg=name)


def test_growth_stays_function_preserving_under_activation_checkpointing():
    model = small_model(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0)
    model = model.double().train()
    model.activation_checkpointing_enable()
    input_ids, attention_mask = batch()
    labels = torch.tensor([0, 1, 2])
    before = model(input_ids, attention_mask=attention_mask).logits.detach()
    head = model.grow_head(0, torch.randn(HIDDEN, dtype=torch.float64))
    assert model.model.layers[0].gradient_checkpointing  # the layer keeps its setting; the new head joins it
    after = model(input_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(after, before, rtol=0, atol=1e-12)
    checkpointed, calls = _gradients_and_layer_calls(model, input_ids, attention_mask, labels)
    assert calls == 4 and checkpointed["model.layers.0.attention.heads.1.o_proj.weight"].abs().sum() > 0
    model.activation_checkpointing_disable()
    plain, _ = _gradients_and_layer_calls(model, input_ids, attention_mask, labels)
    for name, gradient in plain.items():
        torch.testing.assert_close(checkpointed[name], gradient, rtol=1e-12, atol=1e-14, msg=name)
    assert head.o_proj.weight.grad is not None


def test_growth_along_a_direction_sets_query_key_rows_and_the_deflation_basis():
    model = small_model()
    direction = torch.randn(HIDDEN)
    head = model.grow_head(1, direction)
    unit = direction / direction.norm()
    scale = HEAD_DIM**0.25
    torch.testing.assert_close(head.q_proj.weight[0], scale * unit)
    torch.testing.assert_close(head.k_proj.weight[0], scale * unit)
    assert head.q_proj.bias[0] == 0 and head.k_proj.bias[0] == 0
    assert head.o_proj.weight.abs().max() == 0
    gate = model.model.layers[1].attention.gate
    torch.testing.assert_close(gate.active_basis(), unit[None])
    assert gate.basis_owner[0].item() == 2 and model.config.num_heads == [1, 3]


def test_pruning_removes_exactly_that_heads_contribution():
    model = small_model(num_heads=[1, 3])
    input_ids, attention_mask = batch()
    with torch.no_grad():
        model.model.layers[1].attention.heads[1].o_proj.weight.zero_()
        silenced = model(input_ids, attention_mask=attention_mask).logits
        model.model.layers[1].attention.heads[1].o_proj.weight.normal_()
    kept = [model.model.layers[1].attention.heads[i] for i in (0, 2)]
    removed = model.prune_head(1, 1)
    assert model.config.num_heads == [1, 2]
    assert list(model.model.layers[1].attention.heads) == kept and removed not in kept
    pruned = model(input_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(pruned, silenced, atol=1e-6, rtol=0)


def test_resize_heads_reaches_the_requested_counts():
    model = small_model()
    first_head = model.model.layers[1].attention.heads[0]
    model.resize_heads([3, 1])
    assert model.config.num_heads == [3, 1]
    assert [len(layer.attention.heads) for layer in model.model.layers] == [3, 1]
    assert model.model.layers[1].attention.heads[0] is first_head  # pruned from the end
    model.resize_heads(2)
    assert model.config.num_heads == [2, 2]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.grow_head(2), "layer"),
        (lambda m: m.grow_head(-1), "layer"),
        (lambda m: m.grow_head(0, torch.ones(HIDDEN + 1)), "direction"),
        (lambda m: m.grow_head(0, torch.zeros(HIDDEN)), "direction"),
        (lambda m: [m.grow_head(1) for _ in range(3)], "max_heads"),
        (lambda m: m.prune_head(0, 0), "last remaining head"),
        (lambda m: m.prune_head(1, 2), "head"),
        (lambda m: m.resize_heads([1]), "num_heads"),
        (lambda m: m.resize_heads([1, 5]), r"num_heads\[1\]"),
        (lambda m: m.gate_check(second_moments=[torch.eye(HIDDEN)]), "second_moments"),
    ],
)
def test_bad_growth_calls_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call(small_model())


def test_hand_edited_head_counts_are_refused():
    model = small_model()
    model.config.num_heads = [2, 2]
    with pytest.raises(ValueError, match="num_heads"):
        model(torch.ones(1, 4, dtype=torch.long))


@pytest.mark.parametrize("gate_threshold", ["calibrated", "relative"])
def test_grown_checkpoint_reloads_at_its_size_with_identical_logits_and_gate_state(tmp_path, gate_threshold):
    model = small_model(gate_threshold=gate_threshold)
    input_ids, attention_mask = batch()
    model.grow_head(0, torch.randn(HIDDEN))
    model.grow_head(1)
    model.prune_head(1, 0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    model.gate_check(input_ids, attention_mask)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert reloaded.config.num_heads == [2, 2]
    torch.testing.assert_close(
        reloaded(input_ids, attention_mask=attention_mask).logits,
        model(input_ids, attention_mask=attention_mask).logits,
        rtol=0,
        atol=0,
    )
    original, loaded = model.state_dict(), reloaded.state_dict()
    assert original.keys() == loaded.keys()
    assert not any(key.startswith("model.layers.1.attention.heads.2") for key in loaded)
    for key, value in original.items():
        assert torch.equal(value, loaded[key]), key
    # the gate resumes: the next checks decide identically
    first = model.gate_check(input_ids, attention_mask)
    second = reloaded.gate_check(input_ids, attention_mask)
    assert [d.action for d in first] == [d.action for d in second]
    assert [d.lambda_max for d in first] == [d.lambda_max for d in second]
    assert [d.theta_w for d in first] == [d.theta_w for d in second]
    assert reloaded.config.gate_threshold == gate_threshold


def test_fresh_initialisation_of_prototypes_temperatures_and_gate():
    model = small_model(hidden_size=64, head_dim=8, num_prototypes=64, num_heads=[2, 2])
    heads = model.model.layers[0].attention.heads
    prototypes = torch.cat([h.prototype_bank.prototypes.flatten() for h in heads])
    assert prototypes.std().item() == pytest.approx(0.02 * math.sqrt(64), rel=0.1)
    for layer in model.model.layers:
        torch.testing.assert_close(layer.attention.temperatures(), torch.full((2,), model.config.tau_init))
        gate = layer.attention.gate
        assert gate.u_plus.norm().item() == pytest.approx(1.0)
        assert gate.u_minus.norm().item() == pytest.approx(1.0)
        assert int(gate.basis_size) == 0 and int(gate.num_checks) == 0
        assert bool(gate.calibrated)  # the default relative threshold needs no calibration checks


def test_keys_missing_from_a_checkpoint_are_initialised_by_init_weights(tmp_path):
    model = small_model()
    model.gate_check(*batch())
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    missing = [k for k in weights if ".gate." in k or k.endswith("heads.1.prototype_bank.prototypes")]
    save_file(
        {k: v for k, v in weights.items() if k not in missing},
        tmp_path / "model.safetensors",
        metadata={"format": "pt"},
    )
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path, strict=False)  # a partial load
    for layer in reloaded.model.layers:
        gate = layer.attention.gate
        for name, value in gate.initial_state().items():
            assert torch.equal(getattr(gate, name), value), name
    prototypes = reloaded.model.layers[1].attention.heads[1].prototype_bank.prototypes
    assert prototypes.abs().min() > 0 and 0.02 < prototypes.std() < 0.2  # drawn, not left at zero
    kept = reloaded.model.layers[1].attention.heads[0].prototype_bank.prototypes
    assert torch.equal(kept, weights["model.layers.1.attention.heads.0.prototype_bank.prototypes"])


def test_checkpoint_with_the_old_0d_rho_loads_as_a_1_element_vector(tmp_path):
    """Before FSDP2 support `rho` was a 0-d parameter; such a checkpoint (written by hand here) still loads,
    with `from_pretrained` and `load_state_dict`, with identical logits, and saves again in the 1-element
    layout."""
    model = small_model()
    with torch.no_grad():
        for index, layer in enumerate(model.model.layers):  # distinct temperatures: a mix-up would show
            for head, module in enumerate(layer.attention.heads):
                module.prototype_bank.rho.fill_(0.3 * index - 0.2 * head)
    input_ids, attention_mask = batch()
    expected = model(input_ids, attention_mask=attention_mask).logits
    assert all(p.dim() >= 1 for p in model.parameters())  # fully_shard refuses 0-d parameters
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    rho_keys = [key for key in weights if key.endswith(".prototype_bank.rho")]
    assert len(rho_keys) == 3 and all(weights[key].shape == (1,) for key in rho_keys)
    old = {key: value.reshape(()) if key in rho_keys else value for key, value in weights.items()}
    save_file(old, tmp_path / "model.safetensors", metadata={"format": "pt"})
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    for key in rho_keys:
        assert torch.equal(reloaded.get_parameter(key), weights[key])
    torch.testing.assert_close(
        reloaded(input_ids, attention_mask=attention_mask).logits, expected, rtol=0, atol=0
    )
    plain = small_model(seed=1)
    plain.load_state_dict(old)  # nn.Module loading takes the 0-d layout too
    logits = plain(input_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    reloaded.save_pretrained(tmp_path / "again")
    resaved = load_file(tmp_path / "again" / "model.safetensors")
    assert resaved.keys() == weights.keys()
    assert all(torch.equal(resaved[key], weights[key]) for key in weights)
    with pytest.raises(RuntimeError, match="mismatched|size"):  # other shapes are not reshaped silently
        save_file(
            {**weights, rho_keys[0]: torch.zeros(2)},
            tmp_path / "model.safetensors",
            metadata={"format": "pt"},
        )
        AutoModelForSequenceClassification.from_pretrained(tmp_path)


# --------------------------------------------------------------------------------------------- gate


def test_checkpoint_with_the_old_bool_calibrated_flag_loads_into_the_uint8_buffer(tmp_path):
    """`IncrtGate.calibrated` was a bool buffer; a checkpoint holding it (written by hand here) loads with
    `from_pretrained` and `load_state_dict` into the uint8 buffer, each layer's flag kept, and the gates
    then decide as the original's do."""
    model = small_model(gate_threshold="calibrated", gate_calibration_checks=2)
    input_ids, attention_mask = batch()
    model.gate_check(input_ids, attention_mask)
    first_gate = model.model.layers[0].attention.gate
    first_gate.calibrated.fill_(1)  # layer 0 calibrated by hand, layer 1 still calibrating
    first_gate.theta_w.fill_(0.05)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    flags = [key for key in weights if key.endswith(".gate.calibrated")]
    assert len(flags) == 2 and all(weights[key].dtype == torch.uint8 for key in flags)
    old = {key: value.bool() if key in flags else value for key, value in weights.items()}
    save_file(old, tmp_path / "model.safetensors", metadata={"format": "pt"})
    plain = small_model(seed=1, gate_threshold="calibrated", gate_calibration_checks=2)
    plain.load_state_dict(old)
    for reloaded in (AutoModelForSequenceClassification.from_pretrained(tmp_path).eval(), plain):
        loaded = [layer.attention.gate.calibrated for layer in reloaded.model.layers]
        assert [flag.dtype for flag in loaded] == [torch.uint8, torch.uint8]
        assert [int(flag) for flag in loaded] == [1, 0]
    expected = model.gate_check(input_ids, attention_mask)
    for reloaded in (AutoModelForSequenceClassification.from_pretrained(tmp_path).eval(), plain):
        decisions = reloaded.gate_check(input_ids, attention_mask)
        assert [d.action for d in decisions] == [d.action for d in expected]
        assert [d.theta_w for d in decisions] == [d.theta_w for d in expected]


def test_gate_second_moments_are_those_of_the_layer_inputs():
    model = small_model()
    input_ids, attention_mask = batch()
    moments = model.gate_second_moments(input_ids, attention_mask, num_tokens=1000)
    outputs = model.model(input_ids, attention_mask=attention_mask, output_hidden_states=True)
    hidden_states = outputs.hidden_states
    keep = attention_mask.bool().flatten()
    for layer, moment in enumerate(moments):
        tokens = hidden_states[layer].reshape(-1, HIDDEN)[keep]
        torch.testing.assert_close(moment, tokens.T @ tokens / tokens.shape[0])


def test_model_gate_on_planted_weights_grows_k_heads_then_stops():
    """One layer whose single head plants M_a: A_sym has eigenvalues +-8, +-6, +-1 against theta_w = 3."""
    model = small_model(num_hidden_layers=1, num_heads=[1], head_dim=3, max_heads=6, gate_theta_w=3.0)
    generator = torch.Generator().manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(HIDDEN, HIDDEN, generator=generator, dtype=torch.float64))
    spectrum = torch.linspace(3.0, 0.5, HIDDEN, dtype=torch.float64)
    second_moment = (basis @ torch.diag(spectrum) @ basis.T).float()
    head = model.model.layers[0].attention.heads[0]
    planted = [8.0, 6.0, 1.0]
    with torch.no_grad():
        for row, value in enumerate(planted):
            i, j = 2 * row, 2 * row + 1
            mu = 2 * value / (spectrum[i] - spectrum[j])  # coupling of v_i and v_j, see test_incrt_gate.py
            head.q_proj.weight[row] = (2 * mu * basis[:, i]).float()
            head.k_proj.weight[row] = basis[:, j].float()
    grown = []
    for _ in range(20):
        (decision,) = model.gate_check(second_moments=[second_moment])
        if decision.action == "stop":
            break
        if decision.action == "grow":
            grown.append(decision.lambda_max)
            model.grow_head(0, decision.direction)
    assert decision.action == "stop"
    assert model.config.num_heads == [3]
    assert grown == sorted(grown, reverse=True)
    assert grown == pytest.approx([8.0, 6.0], rel=0.05)  # new heads' random rows perturb M_a slightly


def test_fp32_training_at_ten_times_the_learning_rate_stays_finite():
    """Planted task (label = whether token 3 occurs); AdamW at 1e-2, ten times a typical 1e-3."""
    model = small_model(num_labels=2, hidden_dropout_prob=0.0).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    losses = []
    for step in range(40):
        input_ids = torch.randint(4, VOCAB, (16, 10), generator=generator)
        labels = torch.randint(0, 2, (16,), generator=generator)
        input_ids[labels == 1, torch.randint(1, 10, (1,), generator=generator)] = 3
        loss = model(input_ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step == 20:
            new_head = model.grow_head(0)
            optimizer.add_param_group({"params": list(new_head.parameters())})
    assert all(math.isfinite(value) for value in losses)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert sum(losses[-5:]) < sum(losses[:5])

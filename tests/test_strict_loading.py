"""`from_pretrained` of both models with transformers' semantics (missing weights initialised and reported,
shape mismatches an error unless `ignore_mismatched_sizes`, another task head's weights left unused), and
the two refusals of `model_io/strict_loading.py`: base-model weights the config does not build (from every
class and Auto class) and a checkpoint of the other model type."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from geoformers import (
    DDCLIncrtConfig,
    DDCLIncrtForSequenceClassification,
    DDCLIncrtModel,
    DDLmHCConfig,
    DDLmHCForCausalLM,
    DDLmHCModel,
)

IDS = torch.tensor([[1, 5, 7, 3, 2, 9]])


def lm(seed=0, **overrides) -> DDLmHCForCausalLM:
    settings = {
        "vocab_size": 32,
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "intermediate_size": 32,
        "hc_streams": 2,
    }
    torch.manual_seed(seed)
    return DDLmHCForCausalLM(DDLmHCConfig(**{**settings, **overrides})).eval()


def encoder(seed=0, **overrides) -> DDCLIncrtForSequenceClassification:
    settings = {
        "vocab_size": 32,
        "hidden_size": 16,
        "head_dim": 4,
        "num_hidden_layers": 2,
        "num_heads": [3, 2],
        "max_heads": 4,
        "num_prototypes": 4,
        "max_position_embeddings": 8,
        "num_labels": 3,
    }
    torch.manual_seed(seed)
    return DDCLIncrtForSequenceClassification(DDCLIncrtConfig(**{**settings, **overrides})).eval()


def edit_weights(folder, edit) -> None:
    weights = load_file(folder / "model.safetensors")
    save_file(edit(weights), folder / "model.safetensors", metadata={"format": "pt"})


def edit_config(folder, **fields) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))


def without(pattern):
    return lambda weights: {k: v for k, v in weights.items() if pattern not in k}


@pytest.mark.parametrize("tie", [True, False])
def test_a_complete_causal_lm_checkpoint_reloads_cleanly_tied_or_not(tmp_path, tie):
    model = lm(tie_word_embeddings=tie)
    model.save_pretrained(tmp_path)
    reloaded, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert {k: sorted(v) for k, v in info.items()} == {
        "missing_keys": [],
        "unexpected_keys": [],
        "mismatched_keys": [],
        "error_msgs": [],
    }
    assert (reloaded.lm_head.weight is reloaded.model.embed_tokens.weight) == tie
    assert torch.equal(reloaded.eval()(IDS).logits, model(IDS).logits)


def test_a_complete_grown_encoder_checkpoint_reloads_cleanly(tmp_path):
    model = encoder()
    model.grow_head(1)  # three heads in layer 1, the config says so
    model.save_pretrained(tmp_path)
    reloaded, info = AutoModelForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert all(len(keys) == 0 for keys in info.values()) and reloaded.config.num_heads == [3, 3]
    assert torch.equal(reloaded.eval()(IDS).logits, model(IDS).logits)


@pytest.mark.parametrize(
    ("damage", "missing"),
    [
        (lambda folder: edit_weights(folder, without("lm_head")), ["lm_head.weight"]),
        (
            lambda folder: edit_weights(folder, without("layers.1.attn_connection.maps_proj")),
            ["model.layers.1.attn_connection.maps_proj.weight"],
        ),
        (lambda folder: edit_config(folder, num_hidden_layers=3), "model.layers.2."),
    ],
    ids=["dropped lm_head", "dropped maps_proj", "layers 2->3"],
)
def test_weights_the_file_lacks_are_initialised_and_reported_as_in_transformers(
    tmp_path, caplog, damage, missing
):
    saved = lm(tie_word_embeddings=False)
    saved.save_pretrained(tmp_path)
    damage(tmp_path)
    model, info = DDLmHCForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert "LOAD REPORT" in caplog.text and "MISSING" in caplog.text  # transformers' warning
    if isinstance(missing, str):
        assert info["missing_keys"] and all(key.startswith(missing) for key in info["missing_keys"])
    else:
        assert sorted(info["missing_keys"]) == missing
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    loaded = dict(model.state_dict())
    for name, value in saved.state_dict().items():  # every weight the file has is loaded exactly
        if name not in info["missing_keys"]:
            assert torch.equal(loaded[name], value), name
    assert all(loaded[name].isfinite().all() for name in info["missing_keys"])
    if "lm_head.weight" in info["missing_keys"]:  # drawn by _init_weights, N(0, initializer_range^2)
        assert loaded["lm_head.weight"].std().item() == pytest.approx(model.config.initializer_range, rel=0.2)


def test_a_shape_mismatch_is_an_error_unless_ignore_mismatched_sizes(tmp_path, caplog):
    encoder().save_pretrained(tmp_path)
    edit_config(
        tmp_path,
        num_labels=5,
        id2label={str(i): f"LABEL_{i}" for i in range(5)},
        label2id={f"LABEL_{i}": i for i in range(5)},
    )
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        DDCLIncrtForSequenceClassification.from_pretrained(tmp_path)
    assert "classifier.weight" in caplog.text and "MISMATCH" in caplog.text  # transformers' load report
    model, info = DDCLIncrtForSequenceClassification.from_pretrained(
        tmp_path, ignore_mismatched_sizes=True, output_loading_info=True
    )
    assert sorted(key for key, *_ in info["mismatched_keys"]) == ["classifier.bias", "classifier.weight"]
    assert model.classifier.weight.shape == (5, 16)


ENCODER_CLASSES = [
    DDCLIncrtModel,
    DDCLIncrtForSequenceClassification,
    AutoModel,
    AutoModelForSequenceClassification,
]
ENCODER_EDITS = {
    "num_heads [3,2]->[2,2]": ({"num_heads": [2, 2]}, "model.layers.0.attention.heads.2."),
    "num_heads [3,2]->[3,1]": ({"num_heads": [3, 1]}, "model.layers.1.attention.heads.1."),
    "one layer fewer": ({"num_hidden_layers": 1, "num_heads": [3]}, "model.layers.1."),
}


@pytest.mark.parametrize("saved_as", ["task", "base"])
@pytest.mark.parametrize("edit", list(ENCODER_EDITS))
@pytest.mark.parametrize("loader", ENCODER_CLASSES, ids=lambda cls: cls.__name__)
def test_encoder_weights_the_edited_config_does_not_build_are_refused_by_every_class(
    tmp_path, saved_as, edit, loader
):
    """A config.json edited to fewer heads or layers than were saved would load a different function
    (transformers drops the surplus weights with a warning): every class, base or task, refuses it."""
    model = encoder()
    (model if saved_as == "task" else model.model).save_pretrained(tmp_path)
    fields, surplus = ENCODER_EDITS[edit]
    edit_config(tmp_path, **fields)
    surplus = surplus if saved_as == "task" else surplus.removeprefix("model.")
    with pytest.raises(ValueError, match=r"base-model weights .* has no place for: \[(\S+, )*" + surplus):
        loader.from_pretrained(tmp_path)


@pytest.mark.parametrize("saved_as", ["task", "base"])
@pytest.mark.parametrize(
    "loader", [DDLmHCModel, DDLmHCForCausalLM, AutoModel, AutoModelForCausalLM], ids=lambda cls: cls.__name__
)
def test_decoder_weights_of_a_layer_the_edited_config_lacks_are_refused_by_every_class(
    tmp_path, saved_as, loader
):
    model = lm()
    (model if saved_as == "task" else model.model).save_pretrained(tmp_path)
    edit_config(tmp_path, num_hidden_layers=1)
    surplus = "model.layers.1." if saved_as == "task" else "layers.1."
    with pytest.raises(ValueError, match=r"has no place for: \[(\S+, )*" + surplus):
        loader.from_pretrained(tmp_path)


def test_foreign_base_model_weights_are_refused_and_strict_false_drops_them(tmp_path):
    model = lm(tie_word_embeddings=False)
    model.save_pretrained(tmp_path)
    edit_weights(tmp_path, lambda w: {**w, "model.extra.weight": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"no place for: \[model\.extra\.weight\].*strict=False"):
        DDLmHCForCausalLM.from_pretrained(tmp_path)
    lenient, info = DDLmHCForCausalLM.from_pretrained(tmp_path, strict=False, output_loading_info=True)
    assert sorted(info["unexpected_keys"]) == ["model.extra.weight"] and not info["missing_keys"]
    assert torch.equal(lenient.eval()(IDS).logits, model(IDS).logits)
    with pytest.raises(TypeError, match="strict"):
        DDLmHCForCausalLM.from_pretrained(tmp_path, strict="no")


def test_another_models_weights_are_refused(tmp_path):
    lm().save_pretrained(tmp_path / "lm")
    encoder().save_pretrained(tmp_path / "encoder")
    weights = (tmp_path / "encoder" / "model.safetensors").read_bytes()
    (tmp_path / "lm" / "model.safetensors").write_bytes(weights)
    with pytest.raises(ValueError, match=r"no place for: \[model\.embeddings\."):
        AutoModelForCausalLM.from_pretrained(tmp_path / "lm")


@pytest.mark.parametrize(
    ("save", "loader", "named"),
    [
        (lambda: lm(), DDCLIncrtModel, "holds a `ddl_mhc` model .* DDCLIncrtModel loads `ddcl_incrt`"),
        (lambda: lm(), DDCLIncrtForSequenceClassification, "holds a `ddl_mhc` model"),
        (
            lambda: encoder(),
            DDLmHCForCausalLM,
            "holds a `ddcl_incrt` model .* DDLmHCForCausalLM loads `ddl_mhc`",
        ),
        (lambda: encoder(), DDLmHCModel, "holds a `ddcl_incrt` model"),
    ],
    ids=["lm->encoder", "lm->classifier", "encoder->lm", "encoder->decoder"],
)
def test_a_checkpoint_of_the_other_model_type_is_refused_naming_both_types(tmp_path, save, loader, named):
    """transformers only warns ("You are using a model of type ...") and then fails on whichever field of
    the other config does not fit; here the error names the two model types."""
    save().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=named):
        loader.from_pretrained(tmp_path)


def test_a_truncated_weight_file_fails_to_load(tmp_path):
    encoder().save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(Exception, match=r"(?i)incomplete|invalid|header|size|deserializ"):
        DDCLIncrtForSequenceClassification.from_pretrained(tmp_path)


def test_base_and_task_models_load_each_others_checkpoints_as_in_transformers(tmp_path):
    """Base from a task checkpoint (the head's weights stay unused) and a new task head on a base checkpoint
    (the head starts fresh, reported missing); the shared encoder weights load exactly."""
    task = encoder()
    task.save_pretrained(tmp_path / "task")
    base, info = AutoModel.from_pretrained(tmp_path / "task", output_loading_info=True)
    assert isinstance(base, DDCLIncrtModel)
    assert sorted(info["unexpected_keys"]) == ["classifier.bias", "classifier.weight"]
    assert torch.equal(base.eval()(IDS).last_hidden_state, task.model(IDS).last_hidden_state)
    base.save_pretrained(tmp_path / "base")
    fresh, info = DDCLIncrtForSequenceClassification.from_pretrained(
        tmp_path / "base", output_loading_info=True
    )
    assert sorted(info["missing_keys"]) == ["classifier.bias", "classifier.weight"]
    assert torch.equal(fresh.eval().model(IDS).last_hidden_state, task.model(IDS).last_hidden_state)
    causal = lm(tie_word_embeddings=False)
    causal.save_pretrained(tmp_path / "lm")
    assert isinstance(AutoModel.from_pretrained(tmp_path / "lm"), DDLmHCModel)

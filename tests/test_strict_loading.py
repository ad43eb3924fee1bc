"""`from_pretrained` of both models: weights that do not fit the config raise ValueError naming the keys;
complete checkpoints (tied lm_head included) and the base/task cross loads of transformers reload cleanly;
`strict=False` is transformers' partial load."""

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
    settings = {"vocab_size": 32, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                "num_key_value_heads": 2, "intermediate_size": 32, "hc_streams": 2}
    torch.manual_seed(seed)
    return DDLmHCForCausalLM(DDLmHCConfig(**{**settings, **overrides})).eval()


def encoder(seed=0, **overrides) -> DDCLIncrtForSequenceClassification:
    settings = {"vocab_size": 32, "hidden_size": 16, "head_dim": 4, "num_hidden_layers": 1, "num_heads": 2,
                "max_heads": 4, "num_prototypes": 4, "max_position_embeddings": 8, "num_labels": 3}
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
        "missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}
    assert (reloaded.lm_head.weight is reloaded.model.embed_tokens.weight) == tie
    assert torch.equal(reloaded.eval()(IDS).logits, model(IDS).logits)


def test_a_complete_grown_encoder_checkpoint_reloads_cleanly(tmp_path):
    model = encoder()
    model.grow_head(0)  # three heads, the config says so
    model.save_pretrained(tmp_path)
    reloaded, info = AutoModelForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert all(len(keys) == 0 for keys in info.values()) and reloaded.config.num_heads == [3]
    assert torch.equal(reloaded.eval()(IDS).logits, model(IDS).logits)


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda folder: edit_weights(folder, without("lm_head")), "missing [lm_head.weight]"),
        (lambda folder: edit_weights(folder, without("layers.1.attn_connection.maps_proj")),
         "missing [model.layers.1.attn_connection.maps_proj.weight]"),
        (lambda folder: edit_config(folder, num_hidden_layers=3), "missing [model.layers.2."),
        (lambda folder: edit_config(folder, num_hidden_layers=1), "unexpected [model.layers.1."),
        (lambda folder: edit_weights(folder, lambda w: {**w, "model.extra.weight": torch.zeros(2)}),
         "unexpected [model.extra.weight]"),
    ],
    ids=["dropped lm_head", "dropped maps_proj", "layers 2->3", "layers 2->1", "foreign key"],
)
def test_causal_lm_weights_that_do_not_fit_the_config_are_refused(tmp_path, damage, named):
    lm(tie_word_embeddings=False).save_pretrained(tmp_path)
    damage(tmp_path)
    with pytest.raises(ValueError, match=r"do not match the DDLmHCForCausalLM") as error:
        DDLmHCForCausalLM.from_pretrained(tmp_path)
    assert named in str(error.value) and "strict=False" in str(error.value)


def test_another_models_weights_are_refused(tmp_path):
    lm().save_pretrained(tmp_path / "lm")
    encoder().save_pretrained(tmp_path / "encoder")
    weights = (tmp_path / "encoder" / "model.safetensors").read_bytes()
    (tmp_path / "lm" / "model.safetensors").write_bytes(weights)
    with pytest.raises(ValueError, match=r"missing \[.*model\.embed_tokens\.weight.*unexpected \[.*classif"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "lm")


@pytest.mark.parametrize(
    ("pattern", "named"),
    [("classifier.weight", "missing [classifier.weight]"),
     ("heads.1.k_proj", "missing [model.layers.0.attention.heads.1.k_proj.bias, "
                        "model.layers.0.attention.heads.1.k_proj.weight]"),
     ("heads.1.", "missing [model.layers.0.attention.heads.1.")],
)
def test_encoder_weights_missing_a_classifier_or_part_of_a_head_are_refused(tmp_path, pattern, named):
    encoder().save_pretrained(tmp_path)
    edit_weights(tmp_path, without(pattern))
    with pytest.raises(ValueError, match="do not match the DDCLIncrtForSequenceClassification") as error:
        AutoModelForSequenceClassification.from_pretrained(tmp_path)
    assert named in str(error.value)


def test_encoder_weights_of_a_head_the_config_lacks_are_refused(tmp_path):
    encoder().save_pretrained(tmp_path)
    edit_config(tmp_path, num_heads=[1])
    with pytest.raises(ValueError, match=r"unexpected \[model\.layers\.0\.attention\.heads\.1\."):
        DDCLIncrtForSequenceClassification.from_pretrained(tmp_path)


def test_strict_false_is_transformers_partial_load(tmp_path):
    model = encoder()
    model.save_pretrained(tmp_path)
    edit_weights(tmp_path, without("classifier.weight"))
    partial, info = DDCLIncrtForSequenceClassification.from_pretrained(tmp_path, strict=False,
                                                                      output_loading_info=True)
    assert sorted(info["missing_keys"]) == ["classifier.weight"]
    embeddings = partial.model.embeddings.word_embeddings.weight
    assert torch.equal(embeddings, model.model.embeddings.word_embeddings.weight)
    with pytest.raises(TypeError, match="strict"):
        DDCLIncrtForSequenceClassification.from_pretrained(tmp_path, strict="no")


def test_base_and_task_models_load_each_others_checkpoints_as_in_transformers(tmp_path):
    """Base from a task checkpoint (the head's weights stay unused) and a new task head on a base checkpoint
    (the head starts fresh); the shared encoder weights load exactly."""
    task = encoder()
    task.save_pretrained(tmp_path / "task")
    base = AutoModel.from_pretrained(tmp_path / "task")
    assert isinstance(base, DDCLIncrtModel)
    assert torch.equal(base.eval()(IDS).last_hidden_state, task.model(IDS).last_hidden_state)
    base.save_pretrained(tmp_path / "base")
    fresh = DDCLIncrtForSequenceClassification.from_pretrained(tmp_path / "base")
    assert torch.equal(fresh.eval().model(IDS).last_hidden_state, task.model(IDS).last_hidden_state)
    causal = lm(tie_word_embeddings=False)
    causal.save_pretrained(tmp_path / "lm")
    assert isinstance(AutoModel.from_pretrained(tmp_path / "lm"), DDLmHCModel)
    # weights missing inside the base model still raise, whichever class loads them
    edit_weights(tmp_path / "base", without("heads.1.q_proj"))
    with pytest.raises(ValueError, match=r"missing \[model\.layers\.0\.attention\.heads\.1\.q_proj\.bias, "):
        DDCLIncrtForSequenceClassification.from_pretrained(tmp_path / "base")

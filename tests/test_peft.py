"""PEFT LoRA on both model types (docs/ddl_mhc.md, 'Design decisions', PEFT names):
`LoraConfig(target_modules=...)` reaches the documented projections by name; training moves only adapter
tensors; the saved adapter reloads on a fresh base model; `merge_and_unload` and a hand-merged reference W +
(alpha / r) B A give the adapted logits.

DDL-mHC: n = 4 streams, delta update, rtbp chart, dynamic maps (so `maps_proj` and `value_proj` exist).
DDCL-INCRT: heads grown to [2, 3] with `resize_heads`; `DDCLIncrtAttention.forward` calls every head's
q/k/v/o projection module, so LoRA layers wrapped around them act (and get gradients).
"""

import pytest
import torch
from peft import LoraConfig, PeftModel, TaskType, get_peft_model
from peft.tuners.lora import LoraLayer
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

import geoformers

# The names to target (docs/model_doc/ddl_mhc.md, "Fine-tuning with LoRA"): attention, DDL value and
# hyper-connection maps; MLP optional.
DDL_MHC_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
DDL_MHC_HYPER_CONNECTION = ("maps_proj", "value_proj")
DDL_MHC_MLP = ("gate_proj", "up_proj", "down_proj")
DDL_MHC_TARGETS = [*DDL_MHC_ATTENTION, *DDL_MHC_HYPER_CONNECTION, *DDL_MHC_MLP]
DDCL_INCRT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
GROWN_HEADS = [2, 3]
RANK, ALPHA = 4, 8.0
VOCAB = 48

pytestmark = pytest.mark.usefixtures("single_thread")


def tiny_ddl_mhc() -> geoformers.DDLmHCForCausalLM:
    torch.manual_seed(0)
    config = geoformers.DDLmHCConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        hc_streams=4,
        residual="delta",
        hc_chart="rtbp",
        hc_dynamic=True,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=0,
    )
    return geoformers.DDLmHCForCausalLM(config).eval()


def tiny_ddcl_incrt() -> geoformers.DDCLIncrtForSequenceClassification:
    torch.manual_seed(0)
    config = geoformers.DDCLIncrtConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        head_dim=8,
        num_hidden_layers=2,
        num_heads=1,
        num_prototypes=4,
        num_labels=3,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        classifier_dropout=0.0,
    )
    model = geoformers.DDCLIncrtForSequenceClassification(config)
    model.resize_heads(GROWN_HEADS)
    return model.eval()


MODEL_KINDS = {
    "ddl_mhc": (tiny_ddl_mhc, DDL_MHC_TARGETS, TaskType.CAUSAL_LM, AutoModelForCausalLM),
    "ddcl_incrt": (tiny_ddcl_incrt, DDCL_INCRT_TARGETS, TaskType.SEQ_CLS, AutoModelForSequenceClassification),
}
BOTH_KINDS = pytest.mark.parametrize("kind", list(MODEL_KINDS))


def lora_config(kind: str, **overrides) -> LoraConfig:
    _, targets, task_type, _ = MODEL_KINDS[kind]
    return LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=targets, task_type=task_type, **overrides)


def batch(kind: str, seed: int = 1) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (3, 10), generator=generator)
    if kind == "ddl_mhc":
        return {"input_ids": input_ids, "labels": input_ids}
    return {"input_ids": input_ids, "labels": torch.randint(0, 3, (3,), generator=generator)}


def logits_of(model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=inputs["input_ids"]).logits


def lora_module_names(peft_model: PeftModel) -> set[str]:
    modules = peft_model.get_base_model().named_modules()
    return {name for name, module in modules if isinstance(module, LoraLayer)}


def base_key(peft_key: str) -> str:
    """State-dict key of a wrapped model -> the same tensor's key in the plain model."""
    key = peft_key.removeprefix("base_model.model.")
    return key.replace(".base_layer.", ".").replace(".original_module.", ".")


def is_adapter_key(key: str) -> bool:
    return ".lora_" in key or ".modules_to_save." in key


def train_steps(model, inputs: dict[str, torch.Tensor], steps: int = 3, lr: float = 1e-2) -> list[float]:
    """A few AdamW steps (with weight decay) on every tensor that requires grad: a base tensor left
    trainable by mistake would move."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.1)
    model.train()
    losses = []
    for _ in range(steps):
        loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return losses


# ---------------------------------------------------------------------------------------------------------
# Which modules the documented names reach


def expected_ddl_mhc_targets(config, names) -> set[str]:
    """Per layer, by hand: attention, MLP, and each connection's delta.value_proj (delta) and maps_proj
    (dynamic maps: H_pre/H_res when n > 1, beta for delta; with n = 1 and "add" there is no map)."""
    has_maps = config.hc_dynamic and (config.hc_streams > 1 or config.residual == "delta")
    expected = set()
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}"
        expected |= {f"{prefix}.self_attn.{name}" for name in DDL_MHC_ATTENTION if name in names}
        expected |= {f"{prefix}.mlp.{name}" for name in DDL_MHC_MLP if name in names}
        for connection in ("attn_connection", "mlp_connection"):
            if has_maps and "maps_proj" in names:
                expected.add(f"{prefix}.{connection}.maps_proj")
            if config.residual == "delta" and "value_proj" in names:
                expected.add(f"{prefix}.{connection}.delta.value_proj")
    return expected


@pytest.mark.parametrize(
    "variant",
    [
        {"hc_streams": 4, "residual": "delta", "hc_dynamic": True},
        {"hc_streams": 4, "residual": "add", "hc_dynamic": False, "hc_chart": "sinkhorn"},
        {"hc_streams": 1, "residual": "delta", "hc_dynamic": True},
        {"hc_streams": 1, "residual": "add"},
    ],
    ids=["n4-delta-dynamic", "n4-add-static", "n1-delta", "n1-add-llama"],
)
def test_documented_names_reach_every_ddl_mhc_projection(variant):
    config = geoformers.DDLmHCConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=2,
        **variant,
    )
    model = geoformers.DDLmHCForCausalLM(config)
    linear_names = {name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=DDL_MHC_TARGETS))
    expected = expected_ddl_mhc_targets(config, DDL_MHC_TARGETS)
    assert lora_module_names(peft_model) == expected
    # docs/ddl_mhc.md, 'Design decisions' (PEFT names): every learned projection of a layer is reachable; only
    # the LM head is left out.
    assert linear_names - expected == {"lm_head"}


def test_documented_names_reach_every_grown_ddcl_incrt_head():
    peft_model = get_peft_model(tiny_ddcl_incrt(), lora_config("ddcl_incrt"))
    expected = {
        f"model.layers.{layer}.attention.heads.{head}.{name}"
        for layer, count in enumerate(GROWN_HEADS)
        for head in range(count)
        for name in DDCL_INCRT_TARGETS
    }
    assert lora_module_names(peft_model) == expected
    classifier = peft_model.get_base_model().classifier
    assert type(classifier).__name__ == "ModulesToSaveWrapper"  # SEQ_CLS trains its own classifier copy


def test_unknown_target_name_is_rejected_by_name():
    with pytest.raises(ValueError, match="query_key_value"):
        get_peft_model(tiny_ddl_mhc(), LoraConfig(r=2, target_modules=["query_key_value"]))


# ---------------------------------------------------------------------------------------------------------
# The adapter's effect, against a hand-merged reference


def hand_merged_logits(kind: str, peft_model: PeftModel, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Logits of a fresh plain model whose weights are W + (ALPHA / RANK) B A, summed in float64 from the
    adapter's A and B (independent of PEFT's merge); trained classifier copies are copied over."""
    build = MODEL_KINDS[kind][0]
    reference = build()
    state = {key: value.double() for key, value in reference.state_dict().items()}
    for name, module in peft_model.get_base_model().named_modules():
        if isinstance(module, LoraLayer):
            lora_a = module.lora_A["default"].weight.double()
            lora_b = module.lora_B["default"].weight.double()
            state[f"{name}.weight"] += (ALPHA / RANK) * lora_b @ lora_a
    for key, value in peft_model.state_dict().items():
        if ".modules_to_save.default." in key:
            state[base_key(key).replace(".modules_to_save.default.", ".")] = value.double()
    reference.load_state_dict({key: value.float() for key, value in state.items()})
    return logits_of(reference, inputs)


@BOTH_KINDS
def test_adapter_output_equals_hand_merged_weights(kind):
    inputs = batch(kind)
    peft_model = get_peft_model(MODEL_KINDS[kind][0](), lora_config(kind, init_lora_weights=False))
    adapted = logits_of(peft_model, inputs)
    with peft_model.disable_adapter():
        plain = logits_of(peft_model, inputs)
    assert (adapted - plain).abs().max() > 1e-3  # the adapter acts: the equality below is not trivial
    torch.testing.assert_close(adapted, hand_merged_logits(kind, peft_model, inputs), rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# Training, saving, reloading, merging


@BOTH_KINDS
def test_training_changes_only_adapter_tensors(kind):
    model = MODEL_KINDS[kind][0]()
    before = {key: value.clone() for key, value in model.state_dict().items()}
    peft_model = get_peft_model(model, lora_config(kind))
    losses = train_steps(peft_model, batch(kind))
    assert all(torch.isfinite(torch.tensor(losses)))

    after = peft_model.state_dict()
    base_keys = {base_key(key) for key in after if not is_adapter_key(key)}
    assert base_keys == set(before)
    for key, value in after.items():
        if not is_adapter_key(key):
            assert torch.equal(value, before[base_key(key)]), f"base tensor {key} changed"
    initial_adapter = get_peft_model(MODEL_KINDS[kind][0](), lora_config(kind)).state_dict()
    adapter_keys = [key for key in after if is_adapter_key(key)]
    assert adapter_keys and set(adapter_keys) <= set(initial_adapter)
    for key in adapter_keys:
        assert not torch.equal(after[key], initial_adapter[key]), f"adapter tensor {key} did not train"
        if ".lora_B." in key:
            assert after[key].abs().max() > 0


@BOTH_KINDS
def test_saved_adapter_reloads_on_a_fresh_base_model(kind, tmp_path):
    build, _, _, auto_class = MODEL_KINDS[kind]
    inputs = batch(kind)
    build().save_pretrained(tmp_path / "base")
    base = auto_class.from_pretrained(tmp_path / "base").eval()
    peft_model = get_peft_model(base, lora_config(kind, init_lora_weights=False))
    train_steps(peft_model, inputs)
    peft_model.save_pretrained(tmp_path / "adapter")
    saved_files = {path.name for path in (tmp_path / "adapter").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= saved_files
    assert not any(name.endswith((".bin", ".pt", ".pth")) for name in saved_files)  # safetensors only

    fresh = auto_class.from_pretrained(tmp_path / "base").eval()
    if kind == "ddcl_incrt":
        assert fresh.config.num_heads == GROWN_HEADS
    reloaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    saved = {key: value for key, value in peft_model.state_dict().items() if is_adapter_key(key)}
    loaded = reloaded.state_dict()
    for key, value in saved.items():
        assert torch.equal(loaded[key], value), key
    assert not any(parameter.requires_grad for parameter in reloaded.parameters())  # inference mode
    torch.testing.assert_close(logits_of(reloaded, inputs), logits_of(peft_model, inputs), rtol=0, atol=0)


@BOTH_KINDS
def test_merge_and_unload_gives_the_adapted_logits(kind):
    build = MODEL_KINDS[kind][0]
    inputs = batch(kind)
    peft_model = get_peft_model(build(), lora_config(kind, init_lora_weights=False))
    train_steps(peft_model, inputs)
    adapted = logits_of(peft_model, inputs)
    with peft_model.disable_adapter():
        plain = logits_of(peft_model, inputs)
    merged = peft_model.merge_and_unload()
    assert type(merged) is type(build())
    assert not any(isinstance(module, LoraLayer) for module in merged.modules())
    assert (adapted - plain).abs().max() > 1e-3
    torch.testing.assert_close(logits_of(merged, inputs), adapted, rtol=0, atol=1e-5)


def test_causal_lm_adapter_generates_like_the_merged_model():
    peft_model = get_peft_model(tiny_ddl_mhc(), lora_config("ddl_mhc", init_lora_weights=False))
    prompts = torch.tensor([[1, 1, 0, 7, 9, 11], [0, 5, 6, 7, 8, 9]])  # left-padded with pad id 1
    mask = (prompts != 1).long()
    settings = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 1, "eos_token_id": None}
    with torch.no_grad():
        adapted = peft_model.generate(input_ids=prompts, attention_mask=mask, **settings)
        uncached = peft_model.generate(input_ids=prompts, attention_mask=mask, use_cache=False, **settings)
        with peft_model.disable_adapter():
            plain_logits = peft_model(input_ids=prompts, attention_mask=mask).logits
        adapted_logits = peft_model(input_ids=prompts, attention_mask=mask).logits
        merged = peft_model.merge_and_unload()
        merged_tokens = merged.generate(input_ids=prompts, attention_mask=mask, **settings)
    assert adapted.shape == (2, prompts.shape[1] + 8)
    assert (adapted_logits - plain_logits).abs().max() > 1e-2
    assert torch.equal(adapted, uncached)  # LoRA layers under the KV cache: incremental = full forward
    assert torch.equal(adapted, merged_tokens)

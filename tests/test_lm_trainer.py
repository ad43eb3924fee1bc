"""The DDL-mHC scripts' Trainer (`harness.lm_trainer.build_lm_trainer` over `harness.random_windows`;
docs/experiments.md, 'Shared causal-LM recipe') against the scripts' earlier hand-written loop
(tests/nanogpt_loop.py: AdamW grouped by tensor dimension, warm-up + cosine to 0.1 x lr, clipping, random
windows), which produced the committed numbers: given the loop's
settings and `chart_lr_multiplier=1` it gives every parameter the loop's learning rate and decay and logs the
loop's losses over 20 steps on nanoGPT's small CPU shape (4 layers, width 128)."""

import pytest
import torch
from nanogpt_loop import nanogpt_losses
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

import geoformers
from geoformers.training import parameter_groups

from harness.causal_lm import SMALL_CPU_SHAPE, VARIANTS
from harness.lm_trainer import NANOGPT_TRAINING_DEFAULTS, build_lm_trainer
from harness.random_windows import RandomWindows

pytestmark = pytest.mark.usefixtures("single_thread")

STEPS, BATCH, BLOCK, VOCAB, SEED = 20, 12, 64, 65, 1337
LOOP_SETTINGS = dict(NANOGPT_TRAINING_DEFAULTS, warmup_steps=5)  # a warm-up and decay inside 20 steps


def corpus() -> torch.Tensor:
    """20,000 ids of a learnable stream: a fixed random 200-token phrase repeated, 10 % of tokens replaced."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(VOCAB, (200,), generator=generator).repeat(100)
    noise = torch.rand(len(ids), generator=generator) < 0.1
    return torch.where(noise, torch.randint(VOCAB, ids.shape, generator=generator), ids)


def build(name: str):
    torch.manual_seed(0)
    shape = dict(SMALL_CPU_SHAPE, vocab_size=VOCAB, max_position_embeddings=BLOCK)
    if name == "llama":
        return LlamaForCausalLM(LlamaConfig(**shape))
    return geoformers.DDLmHCForCausalLM(geoformers.DDLmHCConfig(**shape, **VARIANTS[name]))


def loop_losses(model, ids) -> list[float]:
    """The hand-written loop (tests/nanogpt_loop.py) with the same settings."""
    settings = LOOP_SETTINGS
    return nanogpt_losses(
        model,
        ids,
        steps=STEPS,
        batch_size=BATCH,
        block_size=BLOCK,
        seed=settings["seed"],
        learning_rate=settings["learning_rate"],
        weight_decay=settings["weight_decay"],
        beta2=settings["adam_beta2"],
        warmup_steps=settings["warmup_steps"],
        min_lr_ratio=settings["lr_scheduler_kwargs"]["min_lr_rate"],
        max_grad_norm=settings["max_grad_norm"],
    )


def trainer_losses(model, ids, tmp_path, **lr_multipliers) -> list[float]:
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        optim="adamw_torch",  # the loop's (foreach) AdamW; the default fused one rounds differently
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        **LOOP_SETTINGS,
    )
    windows = RandomWindows(ids, BATCH, BLOCK, SEED)
    trainer = build_lm_trainer(model, args, windows, **lr_multipliers)
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.parametrize("name", ["ddl-mhc n=4 delta rtbp", "llama"])
def test_trainer_with_the_loops_settings_reproduces_its_losses(name, tmp_path):
    ids = corpus()
    expected = loop_losses(build(name), ids)
    logged = trainer_losses(build(name), ids, tmp_path, chart_lr_multiplier=1.0)
    assert logged == pytest.approx(expected, rel=1e-5)
    assert expected[-1] < expected[0] - 0.2  # it trained


@pytest.mark.parametrize("name", ["ddl-mhc n=1 add", "ddl-mhc n=1 delta", "ddl-mhc n=4 add rtbp", "llama"])
def test_chart_multiplier_one_is_the_loops_grouping_by_dimension(name):
    """Every parameter's (lr, weight decay) under `make_optimizer`'s named groups with the chart at lr x 1 is
    the loop's: decay on tensors of two or more dimensions, none on the rest. At the library's default
    (chart at lr / 6) only the RTBP chart logits `res_bias` differ."""
    model = build(name)

    def settings(**lr_multipliers) -> dict:
        groups = parameter_groups(model, 1e-3, 0.1, **lr_multipliers)
        by_id = {id(p): (group["lr"], group["weight_decay"]) for group in groups for p in group["params"]}
        return {n: by_id[id(p)] for n, p in model.named_parameters()}

    loop = {n: (1e-3, 0.1 if p.ndim >= 2 else 0.0) for n, p in model.named_parameters()}
    assert settings(chart_lr_multiplier=1.0) == loop
    differing = {n for n, setting in settings().items() if setting != loop[n]}
    assert all(n.endswith("res_bias") for n in differing)
    assert bool(differing) == (name == "ddl-mhc n=4 add rtbp")


def test_bad_multiplier_fails_when_the_trainer_is_built(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, use_cpu=True, report_to=[])
    windows = RandomWindows(corpus(), BATCH, BLOCK, SEED)
    with pytest.raises(ValueError, match="chart_lr_multiplier"):
        build_lm_trainer(build("ddl-mhc n=1 add"), args, windows, chart_lr_multiplier=0.0)
    with pytest.raises(TypeError, match="learning_rate_scale"):
        build_lm_trainer(build("ddl-mhc n=1 add"), args, windows, learning_rate_scale=2.0)
    with pytest.raises(ValueError, match="block_size"):
        RandomWindows(corpus()[:10], BATCH, BLOCK, SEED)

"""DDL-mHC fine-tuned with the stock `Trainer` (docs/experiments.md, 'train_causal_lm.py'): character blocks
from `causal_lm_blocks`, `DataCollatorForLanguageModeling(mlm=False)`, metrics from `causal_lm_metrics`
(training/evaluation.py). Checked against hand computations: eval_loss and perplexity against the fp64 mean
token cross-entropy of the eval-mode model, LoRA moves only adapter tensors, a saved model reloads with
identical logits and its mixing is still exactly doubly stochastic and non-expansive, gradient accumulation
equals the large batch.

Model: n = 4 streams, delta residual, rtbp chart, dynamic maps (so `maps_proj` and `value_proj` exist).
The corpus is inline (two Shakespeare sonnets), so the tests run the same with or without ../shared/data.
"""

import math

import numpy as np
import pytest
import torch
from peft import LoraConfig, TaskType, get_peft_model
from test_ddl_mhc import linear_part
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    EvalPrediction,
    Trainer,
    TrainingArguments,
)

import geoformers
from geoformers.models.ddl_mhc.ops.charts import ds_violation
from geoformers.tokenization import build_char_tokenizer
from geoformers.tokenization.char_tokenizer import CHAR_SPECIAL_TOKENS, PAD
from geoformers.training.data import causal_lm_blocks
from geoformers.training.evaluation import causal_lm_metrics

TEXT = """Shall I compare thee to a summer's day?
Thou art more lovely and more temperate:
Rough winds do shake the darling buds of May,
And summer's lease hath all too short a date;
Sometime too hot the eye of heaven shines,
And often is his gold complexion dimm'd;
And every fair from fair sometime declines,
By chance or nature's changing course untrimm'd;
But thy eternal summer shall not fade,
Nor lose possession of that fair thou ow'st;
Nor shall death brag thou wander'st in his shade,
When in eternal lines to time thou grow'st:
So long as men can breathe or eyes can see,
So long lives this, and this gives life to thee.
Let me not to the marriage of true minds
Admit impediments. Love is not love
Which alters when it alteration finds,
Or bends with the remover to remove.
O no! it is an ever-fixed mark
That looks on tempests and is never shaken;
It is the star to every wand'ring bark,
Whose worth's unknown, although his height be taken.
"""
BLOCK = 16
EVAL_BLOCKS = 8
PAD_ID = CHAR_SPECIAL_TOKENS.index(PAD)  # the collator labels it -100
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "maps_proj", "value_proj"]


pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer(TEXT)


@pytest.fixture(scope="module")
def blocks(tokenizer):
    """nanoGPT-style split: the last EVAL_BLOCKS blocks are the evaluation set."""
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    return causal_lm_blocks(ids, BLOCK).train_test_split(test_size=EVAL_BLOCKS, shuffle=False)


def tiny_model(tokenizer, seed: int = 0) -> geoformers.DDLmHCForCausalLM:
    torch.manual_seed(seed)
    config = geoformers.DDLmHCConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=BLOCK,
        hc_streams=4,
        residual="delta",
        hc_chart="rtbp",
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return geoformers.DDLmHCForCausalLM(config)


def make_trainer(model, tokenizer, blocks, output_dir, **overrides) -> Trainer:
    settings = {
        "output_dir": str(output_dir),
        "max_steps": 30,
        "per_device_train_batch_size": 8,
        "per_device_eval_batch_size": 4,
        "learning_rate": 1e-2,
        "warmup_steps": 3,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": True,
        "disable_tqdm": True,
        "seed": 0,
        "dataloader_num_workers": 0,
    }
    settings.update(overrides)
    return Trainer(
        model=model,
        args=TrainingArguments(**settings),
        train_dataset=blocks["train"],
        eval_dataset=blocks["test"],
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        processing_class=tokenizer,
        **causal_lm_metrics(),
    )


@torch.no_grad()
def hand_token_scores(model, dataset) -> tuple[float, float]:
    """(mean next-token cross-entropy, next-token accuracy) over every target that is not a pad token, fp64
    log-softmax of the eval-mode model's logits: an independent reference for the Trainer's numbers."""
    was_training = model.training
    model.eval()
    ids = torch.tensor(dataset["input_ids"])
    logits = model(input_ids=ids).logits[:, :-1]
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    targets = ids[:, 1:]
    nll = -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    model.train(was_training)
    scored = targets != PAD_ID
    return float(nll[scored].mean()), float((logits.argmax(-1) == targets)[scored].double().mean())


def logged_losses(trainer: Trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.fixture(scope="module")
def trained(tokenizer, blocks, tmp_path_factory):
    """A model trained 30 steps with the Trainer: (trainer, loss before training on the eval blocks)."""
    model = tiny_model(tokenizer)
    loss_before, _ = hand_token_scores(model, blocks["test"])
    trainer = make_trainer(model, tokenizer, blocks, tmp_path_factory.mktemp("full"))
    trainer.train()
    return trainer, loss_before


# ----------------------------------------------------------------------------------------------
# Data and metric helpers


def test_causal_lm_blocks_are_consecutive_windows_and_the_collator_makes_labels(tokenizer):
    dataset = causal_lm_blocks(np.arange(11), 4)
    assert dataset["input_ids"] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # remainder [8, 9, 10] dropped
    assert dataset.features["input_ids"].feature.dtype == "int64"
    batch = DataCollatorForLanguageModeling(tokenizer, mlm=False)([dataset[0], dataset[1]])
    ids = torch.tensor(dataset["input_ids"])
    assert torch.equal(batch["input_ids"], ids)
    assert tokenizer.pad_token_id == PAD_ID == 1  # the collator gives the pad token (id 1 here) no loss
    assert torch.equal(batch["labels"], torch.where(ids == PAD_ID, -100, ids))
    assert torch.equal(batch["attention_mask"], torch.ones(2, 4, dtype=torch.long))


@pytest.mark.parametrize(
    ("token_ids", "block_size", "error", "match"),
    [
        ("some text", 4, TypeError, "token_ids must be a list or numpy array"),
        (torch.arange(8), 4, TypeError, "token_ids must be a list or numpy array"),
        ([[1, 2], [3]], 2, ValueError, "token_ids must be a flat sequence of ints"),
        (np.ones((2, 4), dtype=np.int64), 4, ValueError, "token_ids must be a flat sequence"),
        ([0.5, 1.5, 2.5], 2, ValueError, "token_ids must be a flat sequence of ints, got float64"),
        ([3, -1, 2], 2, ValueError, "token_ids must be >= 0"),
        ([1, 2, 3], 1, ValueError, "block_size must be an int >= 2"),
        ([1, 2, 3], True, ValueError, "block_size must be an int >= 2"),
        ([1, 2, 3], 4, ValueError, "token_ids holds 3 tokens, less than one block"),
        ([], 2, ValueError, "token_ids holds 0 tokens"),
    ],
)
def test_causal_lm_blocks_reject_bad_input(token_ids, block_size, error, match):
    with pytest.raises(error, match=match):
        causal_lm_blocks(token_ids, block_size)


def test_causal_lm_metrics_score_shifted_targets_and_skip_ignored_labels():
    """Two rows of random logits, -100 labels in both (one a padded tail): token by token in fp64."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=generator)
    labels = torch.tensor([[3, 1, -100, 6, 2], [4, 0, 5, -100, -100]])
    metrics = causal_lm_metrics()
    predictions = metrics["preprocess_logits_for_metrics"]((logits,), labels)
    result = metrics["compute_metrics"](
        EvalPrediction(predictions=tuple(p.numpy() for p in predictions), label_ids=labels.numpy())
    )
    losses, correct = [], []
    for row in range(2):
        for position in range(4):  # logits at t predict the label at t + 1
            target = int(labels[row, position + 1])
            if target != -100:
                log_probs = torch.log_softmax(logits[row, position].double(), dim=-1)
                losses.append(-float(log_probs[target]))
                correct.append(int(logits[row, position].argmax()) == target)
    assert len(losses) == 5
    assert result["accuracy"] == pytest.approx(sum(correct) / 5, abs=1e-12)
    assert result["perplexity"] == pytest.approx(math.exp(sum(losses) / 5), rel=1e-6)


def test_causal_lm_metrics_name_the_missing_pieces():
    metrics = causal_lm_metrics()
    with pytest.raises(ValueError, match="labels are missing"):
        metrics["preprocess_logits_for_metrics"](torch.zeros(1, 3, 5), None)
    raw_logits = EvalPrediction(predictions=np.zeros((1, 3, 5)), label_ids=np.zeros((1, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="preprocess_logits_for_metrics"):
        metrics["compute_metrics"](raw_logits)
    nothing_scored = EvalPrediction(
        predictions=(np.zeros((1, 2)), np.zeros((1, 2))), label_ids=np.full((1, 3), -100)
    )
    with pytest.raises(ValueError, match="nothing to score"):
        metrics["compute_metrics"](nothing_scored)


# ----------------------------------------------------------------------------------------------
# Full fine-tuning with the Trainer


def test_trainer_lowers_the_training_and_evaluation_loss(trained, blocks):
    trainer, loss_before = trained
    losses = logged_losses(trainer)
    assert len(losses) == 30 and all(math.isfinite(loss) for loss in losses)
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5
    loss_after, _ = hand_token_scores(trainer.model, blocks["test"])
    assert loss_after < loss_before - 0.5


def test_trainer_eval_loss_and_metrics_equal_the_hand_computation(trained, blocks):
    trainer, _ = trained
    metrics = trainer.evaluate()
    loss, accuracy = hand_token_scores(trainer.model, blocks["test"])
    assert metrics["eval_loss"] == pytest.approx(loss, rel=1e-5)
    assert metrics["eval_perplexity"] == pytest.approx(math.exp(loss), rel=1e-5)
    assert metrics["eval_accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert metrics["eval_perplexity"] == pytest.approx(math.exp(metrics["eval_loss"]), rel=1e-5)


def test_perplexity_counts_every_scored_token_with_padded_blocks_and_a_short_last_batch(
    trained, tokenizer, blocks, tmp_path
):
    """Blocks 0 and 4 end in 10 pad tokens (label -100), batches of 3, 3, 2: the perplexity is exp of the
    mean over the 8 x 15 - 2 x 10 scored targets (`eval_loss`, a row-weighted mean of batch means, is not
    that mean here: 2.753 vs 2.778 when this test was written)."""
    trainer, _ = trained
    ids = np.array(blocks["test"]["input_ids"])
    ids[[0, 4], -10:] = PAD_ID
    padded = {"train": blocks["train"], "test": causal_lm_blocks(ids.reshape(-1), BLOCK)}
    uneven = make_trainer(trainer.model, tokenizer, padded, tmp_path, per_device_eval_batch_size=3)
    metrics = uneven.evaluate()
    loss, accuracy = hand_token_scores(trainer.model, padded["test"])
    assert metrics["eval_perplexity"] == pytest.approx(math.exp(loss), rel=1e-5)
    assert metrics["eval_accuracy"] == pytest.approx(accuracy, abs=1e-12)


def test_saved_model_reloads_exactly_and_its_mixing_stays_doubly_stochastic(trained, tokenizer, tmp_path):
    trainer, _ = trained
    trainer.save_model(str(tmp_path))
    model = trainer.model.eval()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(reloaded, geoformers.DDLmHCForCausalLM)
    assert AutoTokenizer.from_pretrained(tmp_path).get_vocab() == tokenizer.get_vocab()
    ids = torch.tensor([tokenizer("Shall I compare thee", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)
        records = reloaded(ids, output_mixing=True).mixing

    fresh_mix = tiny_model(tokenizer).model.layers[0].attn_connection.res_mix_logit
    assert not torch.equal(model.model.layers[0].attn_connection.res_mix_logit, fresh_mix)  # H_res trained
    assert len(records) == 2 * 2
    for record in records:
        assert record.h_res.dtype == torch.float32
        assert float(ds_violation(record.h_res).max()) <= 1e-6
        assert float(record.h_res.min()) >= 0.0
        assert 0.0 < float(record.beta.min()) and float(record.beta.max()) < 2.0
    for t in range(ids.shape[1]):
        product = torch.eye(4 * 32, dtype=torch.float64)
        for record in records:
            step = linear_part(
                record.h_res[0, t].double(), record.beta[0, t].double(), record.direction[0, t].double()
            )
            assert torch.linalg.matrix_norm(step, ord=2) <= 1 + 1e-5
            product = step @ product
        assert torch.linalg.matrix_norm(product, ord=2) <= 1 + 1e-5


# ----------------------------------------------------------------------------------------------
# LoRA with the Trainer


def test_lora_in_the_trainer_moves_only_adapter_weights(tokenizer, blocks, tmp_path):
    """The documented targets (attention, hyper-connection maps, delta value) on a fresh model: the adapters
    learn (training-block loss falls from ln(vocab)), the base weights stay bit-identical."""
    base = tiny_model(tokenizer, seed=1)
    base_weights = {name: param.detach().clone() for name, param in base.named_parameters()}
    config = LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS, task_type=TaskType.CAUSAL_LM)
    model = get_peft_model(base, config)
    adapter_weights = {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" in name}
    assert len(adapter_weights) == 2 * 2 * (4 + 2 * 2)  # A and B; 2 layers; q k v o; maps/value x 2 sublayers
    train_loss_before, _ = hand_token_scores(model, blocks["train"])

    trainer = make_trainer(model, tokenizer, blocks, tmp_path, max_steps=20, learning_rate=2e-2)
    trainer.train()

    for name, param in model.named_parameters():
        if "lora_" in name:
            assert not torch.equal(param, adapter_weights[name]), f"{name} did not train"
        else:
            base_name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            assert torch.equal(param, base_weights[base_name]), f"base weight {base_name} changed"
    train_loss_after, _ = hand_token_scores(model, blocks["train"])
    assert train_loss_after < train_loss_before - 0.05
    eval_loss, eval_accuracy = hand_token_scores(model, blocks["test"])
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] == pytest.approx(eval_loss, rel=1e-5)
    assert metrics["eval_perplexity"] == pytest.approx(math.exp(eval_loss), rel=1e-5)
    assert metrics["eval_accuracy"] == pytest.approx(eval_accuracy, abs=1e-12)


def test_trainer_with_torch_compile_follows_the_eager_losses(tokenizer, blocks, tmp_path):
    """`TrainingArguments(torch_compile=True)` (aot_eager: the traced graph without inductor's minutes of
    C++ code generation) trains DDL-mHC through the compiled graph with the eager run's losses."""
    losses = []
    for compiled in (False, True):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        options = {"torch_compile": True, "torch_compile_backend": "aot_eager"} if compiled else {}
        trainer = make_trainer(
            tiny_model(tokenizer), tokenizer, blocks, tmp_path / str(compiled), max_steps=4, **options
        )
        trainer.train()
        losses.append(logged_losses(trainer))
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        assert (graphs > 0) == compiled  # the compiled run really went through Dynamo
    assert len(losses[1]) == 4
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)


# ----------------------------------------------------------------------------------------------
# Gradient accumulation


def test_gradient_accumulation_gives_the_same_first_update_as_the_large_batch(tokenizer, blocks, tmp_path):
    """SGD (update = -lr * gradient, so a mis-scaled gradient shows), no clipping, the same 8 blocks in order:
    2 micro-batches of 4 must take the step of one batch of 8. The first 4 blocks end in 10 pad tokens (label
    -100), so the halves score 4 x 5 and 4 x 15 targets: only a loss normalised by the token count of the
    whole accumulated batch (the Trainer's `num_items_in_batch`), not a mean of micro-batch means, matches
    (checked: with `trainer.model_accepts_loss_kwargs = False` the updates differ by up to 8e-3)."""
    ids = np.array(blocks["train"]["input_ids"][:8])
    ids[:4, -10:] = PAD_ID
    padded = {"train": causal_lm_blocks(ids.reshape(-1), BLOCK), "test": blocks["test"]}
    updates = []
    for batch_size, accumulation in ((8, 1), (4, 2)):
        model = tiny_model(tokenizer, seed=2)
        start = [param.detach().clone() for param in model.parameters()]
        trainer = make_trainer(
            model,
            tokenizer,
            padded,
            tmp_path / str(batch_size),
            max_steps=1,
            optim="sgd",
            learning_rate=0.1,
            warmup_steps=0,
            max_grad_norm=0.0,
            per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=accumulation,
            train_sampling_strategy="sequential",
        )
        trainer.train()
        moved = zip(model.parameters(), start, strict=True)
        updates.append(torch.cat([(param.detach() - initial).flatten() for param, initial in moved]))
    large_batch, accumulated = updates
    assert float(large_batch.abs().max()) > 1e-4
    torch.testing.assert_close(accumulated, large_batch, rtol=1e-4, atol=1e-7)

"""DDCL-INCRT in bf16 end to end (docs/ddcl_incrt.md): bf16 weights from `from_pretrained(...,
dtype=torch.bfloat16)` and float32 weights under `torch.autocast("cpu", dtype=torch.bfloat16)` train 50
steps of a tiny task with a finite, falling loss; the prototype statistics and the INCRT gate's second
moments stay float32, and a head grown after bf16 training keeps the function."""

import contextlib
import math

import pytest
import torch

from geoformers import DDCLIncrtConfig, DDCLIncrtForSequenceClassification

VOCAB, LENGTH, STEPS = 24, 8, 50

pytestmark = pytest.mark.usefixtures("single_thread")


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A row's content tokens all come from the lower (label 0) or the upper (label 1) half of the
    vocabulary, after [CLS] (id 1)."""
    generator = torch.Generator().manual_seed(step)
    labels = torch.randint(0, 2, (16,), generator=generator)
    half = (VOCAB - 4) // 2
    ids = 4 + labels[:, None] * half + torch.randint(0, half, (16, LENGTH), generator=generator)
    ids[:, 0] = 1
    return ids, labels


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("fp32")
    config = DDCLIncrtConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        head_dim=8,
        num_hidden_layers=1,
        num_heads=2,
        num_prototypes=4,
        max_position_embeddings=LENGTH,
        num_labels=2,
        pooling="mean",
    )
    DDCLIncrtForSequenceClassification(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("precision", ["bf16_weights", "autocast"])
def test_bf16_training_is_finite_and_learns(saved_model, precision):
    if precision == "bf16_weights":
        model = DDCLIncrtForSequenceClassification.from_pretrained(saved_model, dtype=torch.bfloat16)
        assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}
        autocast = contextlib.nullcontext()
    else:
        model = DDCLIncrtForSequenceClassification.from_pretrained(saved_model)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(STEPS):
        ids, labels = batch(step)
        with autocast:
            output = model(input_ids=ids, labels=labels, output_prototype_statistics=True)
        output.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(output.loss.detach()))
    assert all(math.isfinite(loss) for loss in losses)
    assert output.l_q.dtype == torch.float32
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0], losses  # log(2) = 0.69 at the start

    model.eval()
    ids, labels = batch(STEPS)
    with autocast, torch.no_grad():
        moments = model.gate_second_moments(ids)
        before = model(input_ids=ids).logits.float()
        model.grow_head(0)  # function-preserving: the new head's output projection starts at zero
        after = model(input_ids=ids).logits.float()
    assert all(moment.dtype == torch.float32 and torch.isfinite(moment).all() for moment in moments)
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    accuracy = float((before.argmax(-1) == labels).float().mean())
    assert accuracy > 0.8, accuracy

"""DDL-mHC in bf16 end to end (docs/ddl_mhc.md, 'Doubly-stochastic charts': the charts compute in float32 or
float64 inside whatever the model's dtype): bf16 weights from `from_pretrained(..., dtype=torch.bfloat16)`
and float32 weights under `torch.autocast("cpu", dtype=torch.bfloat16)` train 50 steps of a tiny
next-token task with a finite, falling loss, every H_res stays doubly stochastic to float32 rounding, and
`generate` works."""

import contextlib
import math

import pytest
import torch

from geoformers import DDLmHCConfig, DDLmHCForCausalLM
from geoformers.models.ddl_mhc.ops.charts import ds_violation

VOCAB = 17
STEPS = 50
SHAPE = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4
)

pytestmark = pytest.mark.usefixtures("single_thread")


def counting_batch(step: int) -> torch.Tensor:
    """Rows (s, s + 1, ...) mod VOCAB: each token determines the next."""
    starts = torch.randint(0, VOCAB, (4, 1), generator=torch.Generator().manual_seed(step))
    return (starts + torch.arange(10)) % VOCAB


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("fp32")
    DDLmHCForCausalLM(DDLmHCConfig(**SHAPE)).save_pretrained(folder)
    return folder


def assert_doubly_stochastic(model, ids) -> None:
    with torch.no_grad():
        mixing = model(ids, output_mixing=True).mixing
    assert len(mixing) == 2 * SHAPE["num_hidden_layers"]
    for record in mixing:
        assert record.h_res.dtype == torch.float32
        assert float(ds_violation(record.h_res).max()) <= 4 * torch.finfo(torch.float32).eps


@pytest.mark.parametrize("precision", ["bf16_weights", "autocast"])
def test_bf16_training_is_finite_and_learns(saved_model, precision):
    if precision == "bf16_weights":
        model = DDLmHCForCausalLM.from_pretrained(saved_model, dtype=torch.bfloat16)
        assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}
        autocast = contextlib.nullcontext()
    else:
        model = DDLmHCForCausalLM.from_pretrained(saved_model)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(STEPS):
        ids = counting_batch(step)
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    assert all(math.isfinite(loss) for loss in losses)
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0], losses  # log(17) = 2.83 at the start

    model.eval()
    ids = counting_batch(STEPS)[:2, :4]
    with autocast:
        assert_doubly_stochastic(model, ids)
        generated = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert generated.shape == (2, 8) and torch.equal(generated[:, :4], ids)
    assert int(generated.min()) >= 0 and int(generated.max()) < VOCAB

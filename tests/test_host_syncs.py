"""No device-to-host sync in a training step of DDL-mHC beyond what transformers' Llama makes
(docs/reliability.md, 'Arguments'): counted by instrumenting the tensor-to-Python conversions during a
forward and backward, with the value checks as an accelerator runs them (`value_checks("never")`); on a
CUDA machine the same step runs under `torch.cuda.set_sync_debug_mode("error")`."""

import collections
import contextlib

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from geoformers import DDLmHCConfig, DDLmHCForCausalLM
from geoformers.models.value_checks import checks_values, value_checks

SHAPE = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4)
SYNCING_METHODS = ("item", "__bool__", "__float__", "__int__", "tolist")

pytestmark = pytest.mark.usefixtures("single_thread")


@contextlib.contextmanager
def counted_syncs():
    """Counts, per method, the calls of the `torch.Tensor` methods that copy a value to the host."""
    counts = collections.Counter()
    originals = {name: getattr(torch.Tensor, name) for name in SYNCING_METHODS}

    def counting(name):
        def method(self, *args, **kwargs):
            counts[name] += 1
            return originals[name](self, *args, **kwargs)

        return method

    for name in SYNCING_METHODS:
        setattr(torch.Tensor, name, counting(name))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def training_step_syncs(model, masked: bool) -> int:
    ids = torch.randint(0, SHAPE["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids) if masked else None
    model.train()
    with counted_syncs() as counts:
        model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
    return sum(counts.values())


@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "mask"])
def test_ddl_mhc_step_syncs_as_often_as_llama(masked):
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(**SHAPE))
    model = DDLmHCForCausalLM(DDLmHCConfig(**SHAPE))
    llama_syncs = training_step_syncs(llama, masked)
    assert llama_syncs == (1 if masked else 0)  # transformers' mask utility: is the padding mask all ones?
    with value_checks("never"):  # what every accelerator tensor gets
        assert training_step_syncs(model, masked) == llama_syncs
    # On CPU tensors the value checks run: ids, labels, one finiteness check per chart (8), the mask.
    assert training_step_syncs(model, masked) == llama_syncs + 2 + 8 + masked


def test_value_check_switch():
    model = DDLmHCForCausalLM(DDLmHCConfig(**SHAPE))
    ids = torch.randint(0, SHAPE["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(0))
    bad_mask = torch.full_like(ids, 2)
    with pytest.raises(ValueError, match="attention_mask"):
        model(input_ids=ids, attention_mask=bad_mask)
    with value_checks("never"):
        model(input_ids=ids, attention_mask=bad_mask)  # unchecked, as on an accelerator
    meta = torch.empty(1, device="meta")
    assert not checks_values(meta)
    with value_checks("always"):
        assert checks_values(meta) and checks_values(ids)
    with pytest.raises(ValueError, match="policy"):
        with value_checks("gpu"):
            pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="set_sync_debug_mode needs a CUDA device")
def test_cuda_step_makes_no_sync():
    torch.manual_seed(0)
    for model in (LlamaForCausalLM(LlamaConfig(**SHAPE)), DDLmHCForCausalLM(DDLmHCConfig(**SHAPE))):
        model = model.cuda().train()
        ids = torch.randint(0, SHAPE["vocab_size"], (2, 8), device="cuda")
        model(input_ids=ids, labels=ids).loss.backward()  # first call: kernel compilation and autotuning
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            model(input_ids=ids, labels=ids).loss.backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert all(p.grad is None or p.grad.isfinite().all() for p in model.parameters())

"""Two-process FSDP2 checks for tests/test_fsdp2.py (docs/multi_process.md, 'FSDP2'), run by
`torch.multiprocessing.spawn(run, args=(world_size, folder, case_names))` on CPU with gloo.

Per case, every rank builds the same model twice: a plain reference, and a copy sharded with `fully_shard` on
each decoder layer and on the root. Rank r trains on its own batch; the reference runs both ranks' batches and
averages their losses, which is what FSDP's averaged reduce-scatter computes. Checked, in float32:

- the loss and every gradient of one step equal the reference's (gradient norms to 1e-5 relative);
- five AdamW steps track the reference (losses and parameters);
- with `gradient_checkpointing_enable()` before sharding, the gradients are the same again;
- a sharded checkpoint (model and optimizer, torch.distributed.checkpoint) restores every local shard and
  optimizer state exactly into a differently initialised sharded model;
- the full state dict gathered from the shards, saved with `save_pretrained`, loads with `from_pretrained`
  into the same weights.

A case is a `Case`: how to build its model, one rank's batch, and its decoder layers; adding a model is one
entry in CASES.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from geoformers import DDLmHCConfig, DDLmHCForCausalLM
from geoformers.models.ddcl_incrt.configuration_ddcl_incrt import DDCLIncrtConfig
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtForSequenceClassification

GRAD_RTOL = 1e-5
STEPS = 5
LR = 1e-2
SEQ = 8
BATCH = 2


class Case(NamedTuple):
    build: Callable[[int], nn.Module]  # seed -> model in train mode
    batch: Callable[[int], dict]  # rank -> forward arguments with labels
    layers: Callable[[nn.Module], Iterable[nn.Module]]  # the modules sharded before the root


def ddl_mhc(residual: str, chart: str) -> Case:
    config = DDLmHCConfig(
        vocab_size=61,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        hc_streams=4,
        residual=residual,
        hc_chart=chart,
    )

    def build(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return DDLmHCForCausalLM(config).train()

    def batch(rank: int) -> dict:
        generator = torch.Generator().manual_seed(rank)
        ids = torch.randint(0, config.vocab_size, (BATCH, SEQ), generator=generator)
        return {"input_ids": ids, "labels": ids}

    return Case(build, batch, lambda model: model.model.layers)


def ddcl_incrt() -> Case:
    settings = dict(
        vocab_size=48,
        hidden_size=32,
        head_dim=8,
        num_hidden_layers=2,
        num_heads=2,
        max_heads=4,
        num_prototypes=8,
        max_position_embeddings=SEQ,
        num_labels=2,
        hidden_dropout_prob=0.0,
        classifier_dropout=0.0,
        pooling="mean",
    )

    def build(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return DDCLIncrtForSequenceClassification(DDCLIncrtConfig(**settings)).train()

    def batch(rank: int) -> dict:
        generator = torch.Generator().manual_seed(rank)
        ids = torch.randint(0, settings["vocab_size"], (BATCH, SEQ), generator=generator)
        return {"input_ids": ids, "labels": torch.randint(0, 2, (BATCH,), generator=generator)}

    return Case(build, batch, lambda model: model.model.layers)


CASES = {
    "ddl_mhc-delta-rtbp": ddl_mhc("delta", "rtbp"),
    "ddl_mhc-add-rtbp": ddl_mhc("add", "rtbp"),
    "ddl_mhc-delta-sinkhorn": ddl_mhc("delta", "sinkhorn"),
    "ddl_mhc-add-sinkhorn": ddl_mhc("add", "sinkhorn"),
    "ddcl_incrt": ddcl_incrt(),
}


def sharded(case: Case, model: nn.Module, mesh) -> nn.Module:
    model = copy.deepcopy(model)
    for layer in case.layers(model):
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def reference_step(case: Case, model: nn.Module, world_size: int) -> torch.Tensor:
    """The mean of every rank's loss, backpropagated: the gradient FSDP's averaged reduce-scatter gives."""
    losses = [model(**case.batch(rank)).loss for rank in range(world_size)]
    loss = torch.stack(losses).mean()
    loss.backward()
    return torch.stack(losses).detach()


def assert_close_relative(name: str, actual: torch.Tensor, expected: torch.Tensor, rtol: float) -> None:
    error = float((actual - expected).norm())
    scale = float(expected.norm())
    assert error <= rtol * max(scale, 1e-30), f"{name}: |difference| {error:.3g} vs |reference| {scale:.3g}"


def check_gradients(case: Case, reference: nn.Module, model: nn.Module, rank: int, world_size: int) -> None:
    reference.zero_grad()
    model.zero_grad()
    expected_losses = reference_step(case, reference, world_size)
    loss = model(**case.batch(rank)).loss
    loss.backward()
    torch.testing.assert_close(loss.detach(), expected_losses[rank], rtol=GRAD_RTOL, atol=0)
    expected = dict(reference.named_parameters())
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, f"{name} got no gradient under FSDP2"
        assert_close_relative(name, full(parameter.grad), expected[name].grad, GRAD_RTOL)


def check_case(name: str, rank: int, world_size: int, mesh, folder: Path) -> None:
    case = CASES[name]
    reference = case.build(0)
    assert all(parameter.ndim > 0 for parameter in reference.parameters()), "0-d parameters cannot be sharded"
    model = sharded(case, reference, mesh)
    check_gradients(case, reference, model, rank, world_size)

    # Five AdamW steps from here (the gradients above are the first step's).
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=LR)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    for step in range(STEPS):
        if step:
            reference.zero_grad()
            model.zero_grad()
            expected_losses = reference_step(case, reference, world_size)
            loss = model(**case.batch(rank)).loss
            loss.backward()
            torch.testing.assert_close(loss.detach(), expected_losses[rank], rtol=1e-4, atol=1e-6)
        reference_optimizer.step()
        optimizer.step()
    expected = dict(reference.named_parameters())
    for key, parameter in model.named_parameters():
        assert_close_relative(key, full(parameter.detach()), expected[key].detach(), 1e-4)

    # Activation checkpointing under FSDP2: the same gradients as the plain forward.
    checkpointed_reference = case.build(0)
    checkpointing = copy.deepcopy(checkpointed_reference)
    checkpointing.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    check_gradients(case, checkpointed_reference, sharded(case, checkpointing, mesh), rank, world_size)

    # A sharded checkpoint (model and optimizer) restores every shard exactly.
    checkpoint = folder / f"{name}-dcp"
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=checkpoint)
    restored = sharded(case, case.build(1), mesh)
    restored_optimizer = torch.optim.AdamW(restored.parameters(), lr=LR)
    restored_model_state, restored_optimizer_state = get_state_dict(restored, restored_optimizer)
    state = {"model": restored_model_state, "optimizer": restored_optimizer_state}
    dcp.load(state, checkpoint_id=checkpoint)
    set_state_dict(
        restored, restored_optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )
    for (key, saved), (restored_key, loaded) in zip(
        model.state_dict().items(), restored.state_dict().items(), strict=True
    ):
        assert key == restored_key and torch.equal(full(saved), full(loaded)), key
    saved_states = [optimizer.state[parameter] for parameter in model.parameters()]
    loaded_states = [restored_optimizer.state[parameter] for parameter in restored.parameters()]
    for saved, loaded in zip(saved_states, loaded_states, strict=True):
        for moment in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(full(saved[moment]), full(loaded[moment])), moment

    # The full state dict gathered from the shards loads with from_pretrained.
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full_state = get_model_state_dict(model, options=options)
    if rank == 0:
        folder_full = folder / f"{name}-full"
        case.build(2).save_pretrained(folder_full, state_dict=full_state)
        loaded = type(reference).from_pretrained(folder_full)
        loaded_state = loaded.state_dict()
        assert set(loaded_state) == set(full_state), set(loaded_state) ^ set(full_state)
        for key, value in full_state.items():
            assert torch.equal(loaded_state[key], value), key
    dist.barrier()


def run(rank: int, world_size: int, folder: str, case_names: list[str]) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{Path(folder) / 'rendezvous'}", rank=rank, world_size=world_size
    )
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        for name in case_names:
            check_case(name, rank, world_size, mesh, Path(folder))
    finally:
        dist.destroy_process_group()

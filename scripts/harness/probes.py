"""Measurements of a DDCL-INCRT model during and after an experiment: the exact gate spectrum, per-head
directional energies, prototype probes and accuracy on a synthetic dataset."""

from __future__ import annotations

from collections.abc import Callable

import torch
from datasets import Dataset
from transformers import TrainerCallback

from geoformers.models.ddcl_incrt.incrt import (
    DEFAULT_GATE_TOKENS,
    deflate,
    directional_matrix,
    head_directional_energy,
    interaction_matrix,
)
from geoformers.models.ddcl_incrt.modeling_ddcl_incrt import DDCLIncrtPreTrainedModel


@torch.no_grad()
def gate_spectrum(
    model: DDCLIncrtPreTrainedModel, batch: dict, deflated: bool = True, num_tokens: int = DEFAULT_GATE_TOKENS
) -> list[list[float]]:
    """Exact eigenvalues (float64 `eigvalsh`), in decreasing order, of every layer's A_res = P sym(C M_a) P
    (`deflated=False`: A_sym = sym(C M_a)) on `num_tokens` tokens of `batch`, as a gate check samples them:
    the reference for the gate's tracked lambda_max."""
    moments = model.gate_second_moments(**batch, num_tokens=num_tokens)
    spectra = []
    for layer, moment in zip(model.base_model.layers, moments, strict=True):
        attention = layer.attention
        directional = directional_matrix(
            attention.stacked("q_proj").detach().double(), attention.stacked("k_proj").detach().double()
        )
        matrix = interaction_matrix(moment.double(), directional)
        if deflated:
            matrix = deflate(matrix, attention.gate.active_basis().double())
        spectra.append(torch.linalg.eigvalsh(matrix).flip(0).tolist())
    return spectra


@torch.no_grad()
def head_energies(
    model: DDCLIncrtPreTrainedModel, inputs: dict, num_tokens: int = DEFAULT_GATE_TOKENS
) -> list[list[float]]:
    """Per layer and head, the INCRT prune criterion ||C M_a^h||_F (docs/ddcl_incrt.md, 'The spectral gate')
    on `num_tokens` tokens of `inputs` (on the model's device), as a gate check samples them."""
    moments = model.gate_second_moments(
        input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask"), num_tokens=num_tokens
    )
    return [
        head_directional_energy(
            moment, layer.attention.stacked("q_proj").float(), layer.attention.stacked("k_proj").float()
        ).tolist()
        for layer, moment in zip(model.base_model.layers, moments, strict=True)
    ]


class PrototypeProbe(TrainerCallback):
    """Every `every` steps (and at the start of each run), the model in eval mode on a batch: accuracy, L_q,
    L_OLS, V and, per layer and head, tau, min pairwise prototype distance, effective number of used
    prototypes and the INCRT directional energy ||C M_a^h||_F. `batch`: model inputs with `labels`, or a
    function of the global step returning them (e.g. held-out rows of a stream at that step);
    `num_tokens`: the energies' tokens (`head_energies`); `step_offset` turns a run's steps into global
    ones."""

    def __init__(
        self, batch: dict | Callable[[int], dict], every: int, num_tokens: int = DEFAULT_GATE_TOKENS
    ):
        self.batch = batch
        self.every = every
        self.num_tokens = num_tokens
        self.step_offset = 0
        self.records: list[dict] = []

    @torch.no_grad()
    def record(self, model: DDCLIncrtPreTrainedModel, step: int) -> dict:
        was_training = model.training
        model.eval()
        batch = self.batch(step) if callable(self.batch) else self.batch
        try:
            inputs = {name: value.to(model.device) for name, value in batch.items()}
            outputs = model(**inputs, output_prototype_statistics=True)
            energies = head_energies(model, inputs, self.num_tokens)
        finally:
            model.train(was_training)
        accuracy = (outputs.logits.argmax(-1) == inputs["labels"]).float().mean()
        record = {
            "step": step,
            "num_heads": list(model.config.num_heads),
            "accuracy": float(accuracy),
            "loss": float(outputs.loss),
            "l_q": float(outputs.l_q),
            "l_ols": float(outputs.l_ols),
            "prototype_variance": float(outputs.prototype_variance),
            "temperatures": [t.tolist() for t in outputs.temperatures],
            "min_prototype_distance": [d.tolist() for d in outputs.min_prototype_distance],
            "prototype_perplexity": [p.tolist() for p in outputs.prototype_perplexity],
            "head_energy": energies,
        }
        self.records.append(record)
        return record

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        step = state.global_step + self.step_offset
        if not self.records or self.records[-1]["step"] != step:
            self.record(model, step)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if (state.global_step + self.step_offset) % self.every == 0:
            self.record(model, state.global_step + self.step_offset)


def rows_as_batch(dataset: Dataset, rows: range | list[int]) -> dict:
    """Model inputs and labels of equal-length rows as tensors (the synthetic tasks have no padding)."""
    selected = dataset.select(rows)
    return {name: torch.tensor(selected[name]) for name in ("input_ids", "attention_mask", "labels")}


@torch.no_grad()
def evaluate_accuracy(model: DDCLIncrtPreTrainedModel, dataset: Dataset, batch_size: int = 256) -> float:
    """Accuracy of the model (eval mode) on every row of an equal-length synthetic dataset."""
    was_training = model.training
    model.eval()
    correct = 0
    try:
        for start in range(0, len(dataset), batch_size):
            batch = rows_as_batch(dataset, range(start, min(start + batch_size, len(dataset))))
            labels = batch.pop("labels")
            correct += int((model(**batch).logits.argmax(-1) == labels).sum())
    finally:
        model.train(was_training)
    return correct / len(dataset)

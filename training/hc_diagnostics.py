"""Hyper-connection diagnostics of a DDL-mHC model on a fixed probe batch (docs/hc_diagnostics.md).

Per layer and sublayer (attention, then MLP), from one forward pass without gradients:

- `row_entropy`:   -sum_j H_ij log H_ij of H_res, mean over rows and tokens (0 for I, log n for J/n);
- `saturation`:    fraction of interval choices s = sigmoid(t) within `delta` of an end of their interval,
                   s < delta or s > 1 - delta (tbp, rtbp: X = L + (U - L) s; kromhc: s in [0, 1]);
- `beta`:          mean delta gate beta = 2 sigmoid(t_beta) over tokens ("delta" residual);
- `res_mix`:       a = sigmoid(res_mix_logit) in H_res = (1 - a) I + a chart(t);
- `gain_forward` / `gain_backward`: mHC's (arXiv 2512.24880) "Amax gain" of P = H_res^(k) ... H_res^(1)
                   of every sublayer up to this one: max_i sum_j |P_ij| (forward signal gain) and
                   max_j sum_i |P_ij| (backward gradient gain), the largest over the probe's tokens; exactly 1
                   for the exact charts, above 1 where Sinkhorn's rows miss 1;
- `stream_spread`: ||X - 1 mean_i X_i|| / ||X|| of the stream state X (n x d per token) leaving the layer,
                   Frobenius norms summed over the probe's tokens: 0 while every stream is the same;
- `stream_rank`:   effective rank of X across streams, exp(-sum_i p_i log p_i) with p = sigma / sum(sigma)
                   the normalised singular values of X, mean over tokens: 1 for equal streams, n for
                   orthogonal streams of equal norm (Roy & Vetterli 2007).

The two stream metrics are keyed by the MLP sublayer whose write ends the layer (`hc/stream_spread/<l>.mlp`).

`hc_diagnostics(model, input_ids)` returns them as a flat dict `{"hc/<metric>/<layer>.<attn|mlp>": float}`;
`HyperConnectionDiagnosticsCallback(every=N)` merges the same dict into the Trainer's log records every N
steps (and the `report_to` integrations' once the Trainer went through `report_callback_metrics`). The maps
are the model's own `output_mixing=True` records (H_res, beta and the chart logits t_res of every sublayer);
`res_mix` is read from the `HyperConnection` modules' parameters.
"""

from __future__ import annotations

import re

import torch
from torch import nn
from transformers import TrainerCallback, TrainingArguments
from transformers.trainer_callback import TrainerControl, TrainerState

from geoformers.models.config_validation import check_number
from geoformers.models.ddl_mhc.modeling_ddl_mhc import HyperConnection
from geoformers.training.reporting import warn_if_unreported

METRICS = (
    "row_entropy",
    "saturation",
    "beta",
    "res_mix",
    "gain_forward",
    "gain_backward",
    "stream_spread",
    "stream_rank",
)
SATURATING_CHARTS = ("tbp", "rtbp", "kromhc")
SUBLAYERS = ("attn", "mlp")
KEY_PATTERN = re.compile(r"^hc/(?P<metric>[a-z_]+)/(?P<layer>\d+)\.(?P<sublayer>attn|mlp)$")
_CONNECTION_NAME = re.compile(r"(?:^|\.)layers\.(?P<layer>\d+)\.(?P<sublayer>attn|mlp)_connection$")


def diagnostics_key(metric: str, layer: int, sublayer: str) -> str:
    """Log key of one metric of one sublayer, e.g. `hc/row_entropy/0.attn`."""
    return f"hc/{metric}/{layer}.{sublayer}"


def row_entropy(h_res: torch.Tensor) -> torch.Tensor:
    """Mean over rows of -sum_j H_ij log H_ij (0 log 0 = 0), float64: (..., n, n) -> (...)."""
    h = h_res.detach().to(torch.float64).clamp_min(0)
    return -torch.xlogy(h, h).sum(-1).mean(-1)


def saturated_fraction(logits: torch.Tensor, delta: float) -> torch.Tensor:
    """Fraction of s = sigmoid(t) with s < delta or s > 1 - delta over the last dim: (..., m) -> (...)."""
    s = torch.sigmoid(logits.detach().to(torch.float64))
    return ((s < delta) | (s > 1 - delta)).to(torch.float64).mean(-1)


def composite_gains(h_res_sequence: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(forward, backward) gains of P_k = H_k ... H_1 for k = 1..K, each (K, ...): max absolute row sum and
    max absolute column sum of P_k, float64. Static (n, n) and per-token (..., n, n) matrices broadcast."""
    if not h_res_sequence:
        raise ValueError("`h_res_sequence` must hold at least one (..., n, n) matrix")
    product, forward, backward = None, [], []
    for h in h_res_sequence:
        if h.ndim < 2 or h.shape[-1] != h.shape[-2]:
            raise ValueError(
                f"`h_res_sequence` needs square (..., n, n) matrices, got shape {tuple(h.shape)}"
            )
        h = h.detach().to(torch.float64)
        product = h if product is None else torch.matmul(h, product)
        forward.append(product.abs().sum(-1).amax(-1))
        backward.append(product.abs().sum(-2).amax(-1))
    return torch.stack(torch.broadcast_tensors(*forward)), torch.stack(torch.broadcast_tensors(*backward))


def stream_spread(streams: torch.Tensor, valid: torch.Tensor | None = None) -> float:
    """||X - 1 mean_i X_i|| / ||X|| over the tokens of `valid` (all when None), float64: how far the n
    streams of X (..., n, d) are from their mean, relative to the state (0 for equal streams)."""
    x = streams.detach().to(torch.float64)
    if valid is not None:
        x = x[valid.to(x.device)]
    return float((x - x.mean(-2, keepdim=True)).norm() / x.norm())


def effective_rank(streams: torch.Tensor) -> torch.Tensor:
    """exp of the entropy of the normalised singular values of each (n, d) state, float64: (..., n, d) ->
    (...); 1 when the streams are parallel (equal), n when orthogonal with equal norms (0 log 0 = 0)."""
    sigma = torch.linalg.svdvals(streams.detach().to(torch.float64))
    p = sigma / sigma.sum(-1, keepdim=True)
    return torch.exp(-torch.xlogy(p, p).sum(-1))


def _connections(model: nn.Module) -> list[tuple[int, str, HyperConnection]]:
    """(layer, sublayer, module) of every hyper-connection, in forward order."""
    found = []
    for name, module in model.named_modules():
        match = _CONNECTION_NAME.search(name)
        if match is not None and isinstance(module, HyperConnection):
            found.append((int(match["layer"]), match["sublayer"], module))
    if not found:
        raise ValueError(
            "`model` has no hyper-connections (`...layers.<i>.attn_connection` / `mlp_connection`); pass a "
            "DDL-mHC model (DDLmHCForCausalLM or DDLmHCModel, PEFT-wrapped or not)"
        )
    return sorted(found, key=lambda item: (item[0], SUBLAYERS.index(item[1])))


def _token_mean(values: torch.Tensor, valid: torch.Tensor) -> float:
    """Mean over the unmasked tokens of per-token (batch, seq) or static (scalar) values, in float64."""
    return float(values.detach().cpu().to(torch.float64).expand(valid.shape)[valid].mean())


def _token_max(values: torch.Tensor, valid: torch.Tensor) -> float:
    return float(values.detach().cpu().expand(valid.shape)[valid].max())


@torch.no_grad()
def hc_diagnostics(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    delta: float = 0.01,
) -> dict[str, float]:
    """The metrics of the module docstring for every sublayer, on `input_ids` (batch, seq) with an optional
    `attention_mask` (padded tokens are left out). The model runs once in eval mode (its mode is restored)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
    check_number("delta", delta, 0.0, 0.5, low_open=True, high_open=True)
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2:
        raise ValueError(
            f"`input_ids` must be a (batch, seq) tensor, got {getattr(input_ids, 'shape', input_ids)!r}"
        )
    valid = torch.ones(input_ids.shape, dtype=torch.bool)
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"`attention_mask` must be a tensor of the shape of `input_ids` {tuple(input_ids.shape)}"
            )
        valid = attention_mask.detach().cpu().bool()
        if not valid.any():
            raise ValueError("`attention_mask` masks every token of the probe batch")
    connections = _connections(model)
    device = next(model.parameters()).device
    training = model.training
    try:
        model.eval()
        mask = None if attention_mask is None else attention_mask.to(device)
        outputs = model(
            input_ids=input_ids.to(device),
            attention_mask=mask,
            use_cache=False,
            output_mixing=True,
            output_stream_states=True,
        )
        records, states = outputs.mixing, outputs.stream_states
    finally:
        model.train(training)

    metrics, gain_keys, h_res_sequence = {}, [], []
    for (layer, sublayer, module), record in zip(connections, records, strict=True):
        h_res, beta = record.h_res, record.beta
        logits = record.res_logit if module.chart in SATURATING_CHARTS else None
        if h_res is not None:
            entropy = _token_mean(row_entropy(h_res), valid)
            metrics[diagnostics_key("row_entropy", layer, sublayer)] = entropy
            h_res_sequence.append(h_res)
            gain_keys.append((layer, sublayer))
        if logits is not None:
            saturation = _token_mean(saturated_fraction(logits, delta), valid)
            metrics[diagnostics_key("saturation", layer, sublayer)] = saturation
        if beta is not None:
            metrics[diagnostics_key("beta", layer, sublayer)] = _token_mean(beta[..., 0], valid)
        if module.res_mix_logit is not None:
            mix = float(torch.sigmoid(module.res_mix_logit.detach().float()))
            metrics[diagnostics_key("res_mix", layer, sublayer)] = mix
        if sublayer == "mlp" and module.num_streams > 1:
            leaving = states[layer + 1].cpu()
            metrics[diagnostics_key("stream_spread", layer, sublayer)] = stream_spread(leaving, valid)
            rank = _token_mean(effective_rank(leaving), valid)
            metrics[diagnostics_key("stream_rank", layer, sublayer)] = rank
    if h_res_sequence:
        forward, backward = composite_gains(h_res_sequence)
        for (layer, sublayer), gain_forward, gain_backward in zip(gain_keys, forward, backward, strict=True):
            metrics[diagnostics_key("gain_forward", layer, sublayer)] = _token_max(gain_forward, valid)
            metrics[diagnostics_key("gain_backward", layer, sublayer)] = _token_max(gain_backward, valid)
    return metrics


def stream_use(metrics: dict[str, float]) -> dict[str, float]:
    """Whether the streams are used, in four numbers from `hc_diagnostics`' dict (docs/hc_diagnostics.md,
    'Are the streams used'): the stream spread and effective rank leaving the last layer, the mean H_res row
    entropy over sublayers and the largest composite gain (forward or backward, any sublayer)."""
    by_metric: dict[str, dict[int, float]] = {}
    for key, value in metrics.items():
        match = KEY_PATTERN.match(key)
        if match is None:
            raise ValueError(
                f"`metrics` must hold hc_diagnostics keys 'hc/<metric>/<layer>.<sublayer>', got {key!r}"
            )
        by_metric.setdefault(match["metric"], {})[(int(match["layer"]), match["sublayer"])] = value
    needed = ("stream_spread", "stream_rank", "row_entropy", "gain_forward", "gain_backward")
    missing = [metric for metric in needed if metric not in by_metric]
    if missing:
        raise ValueError(f"`metrics` lacks {missing}: the diagnostics of a model with hc_streams > 1")
    last = max(by_metric["stream_spread"])
    gains = [*by_metric["gain_forward"].values(), *by_metric["gain_backward"].values()]
    entropies = list(by_metric["row_entropy"].values())
    return {
        "stream_spread_last": by_metric["stream_spread"][last],
        "stream_rank_last": by_metric["stream_rank"][last],
        "h_res_row_entropy_mean": sum(entropies) / len(entropies),
        "composite_gain_max": max(gains),
    }


class HyperConnectionDiagnosticsCallback(TrainerCallback):
    """`hc_diagnostics` on a fixed probe batch every `every` optimizer steps, merged into that step's Trainer
    log record: the printed logs and `state.log_history` (hence `trainer_state.json`), and the `report_to`
    integrations (TensorBoard, W&B, ...) once the Trainer went through `report_callback_metrics(trainer)`,
    which moves them behind this callback (`training/reporting.py`; a warning says when it is missing).

    The probe is `input_ids` (and `attention_mask`) when given, else the first `probe_size` examples of the
    training set collated by the Trainer's own data collator (read by index, so the data order is unchanged).
    """

    def __init__(
        self,
        every: int = 100,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        probe_size: int = 8,
        delta: float = 0.01,
    ):
        for name, value in (("every", every), ("probe_size", probe_size)):
            check_number(name, value, 1, integer=True)
        check_number("delta", delta, 0.0, 0.5, low_open=True, high_open=True)
        if input_ids is not None and (not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2):
            raise ValueError(
                f"`input_ids` must be a (batch, seq) tensor or None, got {type(input_ids).__name__}"
            )
        if attention_mask is not None and input_ids is None:
            raise ValueError("`attention_mask` needs `input_ids` (the probe batch it masks)")
        self.every, self.probe_size, self.delta = every, probe_size, delta
        self.input_ids, self.attention_mask = input_ids, attention_mask
        self.pending: tuple[int, dict[str, float]] | None = None

    def _probe_from(self, train_dataloader) -> None:
        dataset = getattr(train_dataloader, "dataset", None)
        try:
            features = [dataset[i] for i in range(min(self.probe_size, len(dataset)))]
        except (TypeError, KeyError, IndexError, NotImplementedError) as error:
            raise ValueError(
                "HyperConnectionDiagnosticsCallback cannot read a probe batch from the training set by index "
                f"({type(dataset).__name__}); pass `input_ids` (and `attention_mask`) to the callback"
            ) from error
        batch = train_dataloader.collate_fn(features)
        self.input_ids, self.attention_mask = batch["input_ids"], batch.get("attention_mask")

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if self.input_ids is None:
            self._probe_from(kwargs.get("train_dataloader"))
        warn_if_unreported(self, args, state, "hyper-connection diagnostics (hc/*)")

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model=None, **kwargs
    ):
        """Compute the diagnostics after every `every`-th optimizer step and ask the Trainer to log."""
        if state.global_step % self.every:
            return
        metrics = hc_diagnostics(model, self.input_ids, self.attention_mask, delta=self.delta)
        self.pending = (state.global_step, metrics)
        control.should_log = True

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs=None, **kwargs
    ):
        """Merge the pending diagnostics into the record of the step they were computed at."""
        if self.pending is None or logs is None or self.pending[0] != state.global_step:
            return
        metrics = self.pending[1]
        self.pending = None
        logs.update(metrics)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(metrics)


__all__ = [
    "HyperConnectionDiagnosticsCallback",
    "composite_gains",
    "diagnostics_key",
    "effective_rank",
    "hc_diagnostics",
    "row_entropy",
    "saturated_fraction",
    "stream_spread",
    "stream_use",
]

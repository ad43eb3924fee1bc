"""Configuration of the DDCL-INCRT encoder (docs/ddcl_incrt.md): grown heads, prototype blocks, spectral
gate."""

# first: a transformers outside the supported range fails here, naming both (docs/versions.md)
from geoformers.models.transformers_range import TRANSFORMERS_REQUIREMENT  # noqa: F401

# isort: split

from typing import Literal, get_args

from huggingface_hub.dataclasses import as_validated_field
from huggingface_hub.errors import StrictDataclassError
from transformers import BertConfig
from transformers.utils.type_validators import interval

from geoformers.models.architecture_names import name_non_generator
from geoformers.models.config_validation import (
    MAX_FLOAT,
    MAX_SIZE,
    ValidatedConfig,
    layers,
    optional,
    plain_error,
    size,
    strict_config,
)

Pooling = Literal["cls", "mean"]
GateThreshold = Literal["calibrated", "relative"]
GateRule = Literal["max_only", "bidirectional", "need"]
GATE_THRESHOLDS, GATE_RULES = get_args(GateThreshold), get_args(GateRule)
# tau enters the prototype block as -||o - p_k||^2 / tau with gradient ||o - p_k||^2 / tau^2 (float32): a
# floor of 1e-6 keeps both finite for squared distances up to 1e26; the ceiling keeps rho = softplus^-1(tau)
# finite.
temperature = interval(min=1e-6, max=1e30)
# layer_norm_eps below float32's smallest positive number rounds to 0, and the LayerNorm of a constant input
# (e.g. a model initialised at a tiny initializer_range) is then 0 / 0.
LAYER_NORM_EPS_FLOOR = 1e-30
# lambda in loss = task loss + lambda * mean L_q; far above this the sum overflows or swamps the task loss.
PROTOTYPE_LOSS_WEIGHT_CEILING = 1e6
positive = interval(min=0.0, max=MAX_FLOAT, exclude_min=True)
probability = interval(min=0.0, max=1.0, exclude_max=True)
step = interval(min=0.0, max=1.0, exclude_min=True)


@as_validated_field
def bert_config_dict(bert_config) -> None:
    """A `BertConfig.to_dict()` (its `hidden_size` must equal the DDCL-INCRT one: `validate_architecture`)."""
    if bert_config is None:
        return
    if bert_config.get("model_type", "bert") != "bert":
        raise ValueError(f"must describe a BERT encoder, got model_type {bert_config['model_type']!r}")
    try:
        BertConfig.from_dict(bert_config)
    except StrictDataclassError as error:
        raise plain_error(error, "is not a valid BertConfig: ") from None


@strict_config
class DDCLIncrtConfig(ValidatedConfig):
    r"""Configuration of [`DDCLIncrtModel`] / [`DDCLIncrtForSequenceClassification`] (docs/ddcl_incrt.md).

    `num_heads` (one count per layer) is the single source of truth for the architecture: `grow_head`,
    `prune_head` and `resize_heads` edit it, `from_pretrained` builds exactly that many heads per layer.

    Validated as both configurations are (`models/config_validation.py`): each field's type and range whenever
    it is set, and the fields that must agree (`num_heads`, `num_hidden_layers` and `max_heads`, `tau_init`
    and `tau_min`, `bert_config` and `hidden_size`, `pad_token_id` and `vocab_size`, the size of the model)
    at construction, on every assignment and `update` (a refused one is undone; change coupled fields together
    with `update`), at model build and at `save_pretrained`. Sizes are at most 2^24, layers 2^14, weights
    2^32 elements.

    The `gate_*` fields choose the growth rule and hold its parameters; the cadence (optimizer steps between
    checks, tokens and tracker iterations per check) is `IncrtGrowthCallback`'s (docs/growth_gate.md,
    'Cadence'). A config.json that still carries the former fields `gate_check_every`, `gate_num_tokens` or
    `gate_tracker_steps` loads with them as plain attributes, which the callback reads as the defaults of its
    `check_every`, `gate_num_tokens` and `tracker_steps`.

    Args:
        vocab_size, hidden_size, num_hidden_layers, max_position_embeddings, type_vocab_size (0 = no
            token-type embedding), layer_norm_eps (at least 1e-30), hidden_dropout_prob, pad_token_id,
            initializer_range (at most 1): as in BERT (the embeddings are BERT-compatible).
        num_labels, problem_type: as in BERT's sequence classifier: num_labels = 1 is regression (MSE),
            integer labels give cross-entropy, "multi_label_classification" (or float labels) BCE.
        num_heads (`int | list[int]`): heads per layer; an int is expanded to every layer (also when
            assigned later). Default 1 each. `num_attention_heads` (transformers' name) reads the largest
            per-layer count, which is every layer's count when they agree; assigning (or passing) it sets
            every layer to it.
        head_dim (`int`): width of every head (queries, keys, values and prototypes).
        max_heads (`int`): per-layer cap on heads; default `hidden_size // head_dim`.
        attention_probs_dropout_prob (`float`): dropout on attention probabilities.
        num_prototypes (`int`): prototypes per head (DDCL bank, one per head).
        tau_init, tau_min (`float`): initial and minimum temperature, tau = tau_min + softplus(rho), both in
            [1e-6, 1e30].
        prototype_loss_weight (`float`): lambda in loss = task loss + lambda * mean L_q, in [0, 1e6].
        pooling (`"cls" | "mean"`): first token or masked mean over tokens.
        classifier_dropout (`float`): dropout before the classifier.
        gate_theta_w (`float | None`): fixed growth threshold theta_w (then `gate_threshold` is not read);
            None = set it by `gate_threshold`.
        gate_threshold (`"relative" | "calibrated"`): how theta_w is set when `gate_theta_w` is None.
            "relative" (default): at every check, theta_w = factor * ||A_sym||_F of the current undeflated
            matrix, so the test does not depend on the scale of X, W_Q, W_K, which drift during training.
            "calibrated" (the author's): once, theta_w = factor * median ||A_res||_F over the first checks,
            then fixed; with it growth runs to `max_heads` once training scales the spectrum up
            (docs/growth_gate.md).
        gate_rule (`"max_only" | "bidirectional" | "need"`): "max_only" (default) grows when
            lambda_max(A_res) > theta_w; "bidirectional" (the author's rule) also needs lambda_min(A_res) <
            phi_w and T_d checks since the layer's last growth, and couples the trackers; "need" grows when
            a held-out probe says one more head lowers the loss, at a plateau of the loss
            (docs/growth_gate.md, 'The need rule'; the `gate_need_*` fields). The four fields below are read
            by "bidirectional" only.
        gate_phi_w_factor (`float`): phi_w = factor * theta_w (the author's 0.5).
        gate_dwell_kappa, gate_dwell_eps (`float`): kappa_T > 0 and eps in (0, 1) of the dwell
            T_d = ceil(kappa_T / (eta Delta+^2) log(1 / eps)) (the author's 2 and 0.05).
        gate_use_lambda_min_test, gate_use_dwell, gate_couple_trackers (`bool`): ablations of the
            bidirectional rule's ingredients (all True: the author's rule).
        gate_need_t (`float`): "need" grows only when the t statistic of the probe's paired held-out loss
            drop exceeds it (default 3) ...
        gate_need_gain (`float`): ... and that drop exceeds this fraction of the probe's loss (0.02), or the
            t statistic of the paired held-out 0/1 error drop exceeds `gate_need_t` ...
        gate_need_error (`float`): ... and the probe's held-out classification error drops by more than this
            (0.005: half a point of accuracy); a model whose own error on the monitor rows is at most this
            reads the probe at every check, and a lack of need stops it.
        gate_need_plateau (`float`): "need" grows only once the loss moved by at most this fraction since
            the previous check (or since growth started, for the first) (0.02).
        gate_need_adoption (`float`): the newest grown head is in use when removing it raises the loss by
            more than this fraction of the loss (0.1); until then, or `gate_need_patience` checks (4),
            "need" does not grow again.
        gate_calibration_factor (`float`): the factor of `gate_threshold`.
        gate_calibration_checks (`int`): number of checks whose ||A_res||_F calibrate theta_w ("calibrated").
        gate_prune_factor (`float`): prune threshold phi_g = factor * theta_w (0 disables pruning).
        gate_prune_patience (`int`): consecutive checks below phi_g before a head is pruned.
        gate_oja_step, gate_mca_step (`float`): Oja / MCA EXIN step sizes in (0, 1], relative to a bound on
            the spectral radius of A_res.
        gate_tracker_tolerance (`float`): a tracker has converged when ||A u - rho u|| <= tol * max(|rho|,
            theta_w), rho = u^T A u.
        gate_use_exact_eigh (`bool`): use the exact `eigh` reference instead of the trackers.
        bert_config (`dict | None`): a `BertConfig.to_dict()`; when set, a BERT encoder of that shape runs
            between the embeddings and the DDCL-INCRT layers (`wrap_bert_embeddings` with
            `use_encoder_outputs=True`), so `from_pretrained` rebuilds it. None (default): the embeddings feed
            the first layer directly.
    """

    model_type = "ddcl_incrt"
    keys_to_ignore_at_inference = [
        "hidden_states",
        "attentions",
        "l_q",
        "l_ols",
        "prototype_variance",
        "temperatures",
        "min_prototype_distance",
        "prototype_perplexity",
    ]

    vocab_size: int = size(default=30522)
    hidden_size: int = size(default=256)
    num_hidden_layers: int = layers(default=1)
    num_heads: int | list[int] | None = None
    head_dim: int = size(default=32)
    max_heads: int | None = optional(size)(default=None)
    num_prototypes: int = interval(min=2, max=MAX_SIZE)(default=16)
    tau_init: int | float = temperature(default=1.0)
    tau_min: int | float = temperature(default=0.05)
    prototype_loss_weight: int | float = interval(min=0.0, max=PROTOTYPE_LOSS_WEIGHT_CEILING)(default=0.1)
    max_position_embeddings: int = size(default=512)
    type_vocab_size: int = interval(min=0, max=MAX_SIZE)(default=2)
    layer_norm_eps: int | float = interval(min=LAYER_NORM_EPS_FLOOR, max=MAX_FLOAT)(default=1e-12)
    hidden_dropout_prob: int | float = probability(default=0.1)
    attention_probs_dropout_prob: int | float = probability(default=0.0)
    classifier_dropout: int | float = probability(default=0.1)
    pooling: Pooling = "cls"
    # a weight standard deviation; above 1 the attention and prototype distances of a fresh model overflow
    initializer_range: int | float = interval(min=0.0, max=1.0, exclude_min=True)(default=0.02)
    pad_token_id: int | None = 0
    gate_theta_w: int | float | None = optional(positive)(default=None)
    gate_threshold: GateThreshold = "relative"
    gate_rule: GateRule = "max_only"
    gate_phi_w_factor: int | float = interval(min=-MAX_FLOAT, max=MAX_FLOAT)(default=0.5)
    gate_dwell_kappa: int | float = positive(default=2.0)
    gate_dwell_eps: int | float = interval(min=0.0, max=1.0, exclude_min=True, exclude_max=True)(default=0.05)
    gate_use_lambda_min_test: bool = True
    gate_use_dwell: bool = True
    gate_couple_trackers: bool = True
    gate_need_t: int | float = interval(min=0.0, max=MAX_FLOAT)(default=3.0)
    gate_need_gain: int | float = interval(min=0.0, max=1.0)(default=0.02)
    gate_need_error: int | float = interval(min=0.0, max=1.0)(default=0.005)
    gate_need_plateau: int | float = interval(min=0.0, max=1.0)(default=0.02)
    gate_need_adoption: int | float = interval(min=0.0, max=MAX_FLOAT)(default=0.1)
    gate_need_patience: int = size(default=4)
    gate_calibration_factor: int | float = positive(default=0.1)
    gate_calibration_checks: int = size(default=3)
    gate_prune_factor: int | float = interval(min=0.0, max=MAX_FLOAT)(default=0.05)
    gate_prune_patience: int = size(default=3)
    gate_oja_step: int | float = step(default=0.9)
    gate_mca_step: int | float = step(default=0.9)
    gate_tracker_tolerance: int | float = step(default=0.02)
    gate_use_exact_eigh: bool = False
    bert_config: dict | None = bert_config_dict(default=None)

    def __post_init__(self, **kwargs):
        heads = kwargs.pop("num_attention_heads", None)
        if heads is not None:
            if self.num_heads is not None and self.num_heads != heads:
                raise ValueError(
                    f"`num_attention_heads` ({heads!r}) contradicts `num_heads` "
                    f"({self.num_heads!r}): pass one of them"
                )
            self.num_heads = heads
        if self.max_heads is None:
            if self.head_dim > self.hidden_size:
                raise ValueError(
                    f"`head_dim` ({self.head_dim}) must not exceed `hidden_size` ({self.hidden_size}) "
                    "when `max_heads` is left to its default hidden_size // head_dim"
                )
            self.max_heads = self.hidden_size // self.head_dim
        if self.num_heads is None:
            self.num_heads = 1
        super().__post_init__(**kwargs)

    def __setattr__(self, key, value):
        """An int assigned to `num_heads` is expanded to every layer, as in the constructor."""
        layers = self.__dict__.get("num_hidden_layers")
        if key == "num_heads" and isinstance(value, int) and isinstance(layers, int):
            value = [value] * layers
        super().__setattr__(key, value)

    @property
    def num_attention_heads(self) -> int:
        """transformers' name for the head count: the largest per-layer count in `num_heads`."""
        return max(self.num_heads)

    @num_attention_heads.setter
    def num_attention_heads(self, value: int) -> None:
        self.num_heads = value

    def validate_architecture(self) -> None:
        """`num_heads` has one count in [1, max_heads] per layer; `tau_init` > `tau_min`; a `bert_config`
        encoder is as wide as the layers it feeds."""
        if len(self.num_heads) != self.num_hidden_layers:
            raise ValueError(
                f"`num_heads` has {len(self.num_heads)} entries but `num_hidden_layers` is "
                f"{self.num_hidden_layers}"
            )
        for layer, count in enumerate(self.num_heads):
            if not 1 <= count <= self.max_heads:
                raise ValueError(
                    f"`num_heads[{layer}]` = {count} must lie in [1, `max_heads` = {self.max_heads}]"
                )
        if not self.tau_init > self.tau_min:
            raise ValueError(f"`tau_init` ({self.tau_init}) must exceed `tau_min` ({self.tau_min})")
        if self.bert_config is not None:
            encoder_width = self.bert_config.get("hidden_size", BertConfig.hidden_size)
            if encoder_width != self.hidden_size:
                raise ValueError(
                    f"`bert_config['hidden_size']` ({encoder_width}) must equal `hidden_size` "
                    f"({self.hidden_size})"
                )

    def weight_sizes(self) -> dict[str, int]:
        """The embeddings, each head's projections and prototype bank, and the growth gate's basis
        (docs/ddcl_incrt.md)."""
        d, head = self.hidden_size, self.head_dim
        embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * d
        per_head = 4 * d * head + self.num_prototypes * head
        return {
            "`vocab_size` x `hidden_size`": self.vocab_size * d,
            "`max_position_embeddings` x `hidden_size`": self.max_position_embeddings * d,
            "`num_prototypes` x `head_dim`": self.num_prototypes * head,
            "`hidden_size` x `head_dim`": d * head,
            "`max_heads` x `hidden_size`": self.max_heads * d,
            "parameters (`num_heads` x (`num_prototypes`, `hidden_size`) x `head_dim` + the embeddings)": (
                embeddings + sum(self.num_heads) * per_head + self.num_hidden_layers * self.max_heads * d
            ),
        }


name_non_generator("DDCLIncrtForSequenceClassification", "AutoModelForSequenceClassification")
name_non_generator("DDCLIncrtModel", "AutoModel")

__all__ = ["DDCLIncrtConfig"]

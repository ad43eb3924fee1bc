"""Configuration of the DDCL-INCRT encoder (docs/ddcl_incrt.md): grown heads, prototype blocks, spectral
gate."""

from __future__ import annotations

import math

import torch
from transformers import BertConfig, PreTrainedConfig

from geoformers.configuration.validation import PROBLEM_TYPES, check_float, check_int

POOLING_MODES = ("cls", "mean")
GATE_THRESHOLDS = ("calibrated", "relative")
GATE_RULES = ("max_only", "bidirectional")
# tau enters the prototype block as -||o - p_k||^2 / tau with gradient ||o - p_k||^2 / tau^2 (float32): a
# floor of 1e-6 keeps both finite for squared distances up to 1e26; the ceiling keeps rho = softplus^-1(tau)
# finite.
TAU_FLOOR, TAU_CEILING = 1e-6, 1e30
# initializer_range is a weight standard deviation; above 1 the attention and prototype distances of a fresh
# model overflow float32 long before training could recover.
INITIALIZER_RANGE_CEILING = 1.0
# layer_norm_eps below float32's smallest positive number rounds to 0, and the LayerNorm of a constant input
# (e.g. a model initialised at a tiny initializer_range) is then 0 / 0.
LAYER_NORM_EPS_FLOOR = 1e-30
# lambda in loss = task loss + lambda * mean L_q; far above this the sum overflows or swamps the task loss.
PROTOTYPE_LOSS_WEIGHT_CEILING = 1e6


class DDCLIncrtConfig(PreTrainedConfig):
    r"""Configuration of [`DDCLIncrtModel`] / [`DDCLIncrtForSequenceClassification`] (docs/ddcl_incrt.md).

    `num_heads` (one count per layer) is the single source of truth for the architecture: `grow_head`,
    `prune_head` and `resize_heads` edit it, `from_pretrained` builds exactly that many heads per layer.

    Validation runs at construction, when a model is built from the config and at `save_pretrained`
    (`validate`); fields assigned in between are checked then, not on assignment (coupled fields such as
    `num_hidden_layers` and `num_heads` would otherwise have to change in one step).

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
        gate_rule (`"max_only" | "bidirectional"`): "max_only" (default) grows when lambda_max(A_res) >
            theta_w; "bidirectional" (the author's rule) also needs lambda_min(A_res) < phi_w and T_d checks
            since the layer's last growth, and couples the trackers (docs/growth_gate.md). The four fields
            below are read by "bidirectional" only.
        gate_phi_w_factor (`float`): phi_w = factor * theta_w (the author's 0.5).
        gate_dwell_kappa, gate_dwell_eps (`float`): kappa_T > 0 and eps in (0, 1) of the dwell
            T_d = ceil(kappa_T / (eta Delta+^2) log(1 / eps)) (the author's 2 and 0.05).
        gate_use_lambda_min_test, gate_use_dwell, gate_couple_trackers (`bool`): ablations of the
            bidirectional rule's ingredients (all True: the author's rule).
        gate_calibration_factor (`float`): the factor of `gate_threshold`.
        gate_calibration_checks (`int`): number of checks whose ||A_res||_F calibrate theta_w ("calibrated").
        gate_prune_factor (`float`): prune threshold phi_g = factor * theta_w (0 disables pruning).
        gate_prune_patience (`int`): consecutive checks below phi_g before a head is pruned.
        gate_oja_step, gate_mca_step (`float`): Oja / MCA EXIN step sizes in (0, 1], relative to a bound on
            the spectral radius of A_res.
        gate_tracker_steps (`int`): most tracker iterations per check (warm-started from the last check).
        gate_tracker_tolerance (`float`): a tracker has converged when ||A u - rho u|| <= tol * max(|rho|,
            theta_w), rho = u^T A u.
        gate_num_tokens (`int`): tokens sampled (evenly spaced over non-padding tokens) per check.
        gate_check_every (`int`): default number of optimizer steps between gate checks (growth callback).
        gate_use_exact_eigh (`bool`): use the exact `eigh` reference instead of the trackers.
        bert_config (`dict | None`): a `BertConfig.to_dict()`; when set, a BERT encoder of that shape runs
            between the embeddings and the DDCL-INCRT layers (`wrap_bert_embeddings` with
            `use_encoder_outputs=True`), so `from_pretrained` rebuilds it. None (default): the embeddings feed
            the first layer directly.
    """

    model_type = "ddcl_incrt"
    keys_to_ignore_at_inference = [
        "hidden_states", "attentions", "l_q", "l_ols", "prototype_variance", "temperatures",
        "min_prototype_distance", "prototype_perplexity",
    ]

    vocab_size: int = 30522
    hidden_size: int = 256
    num_hidden_layers: int = 1
    num_heads: int | list[int] | None = None
    head_dim: int = 32
    max_heads: int | None = None
    num_prototypes: int = 16
    tau_init: float = 1.0
    tau_min: float = 0.05
    prototype_loss_weight: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.0
    classifier_dropout: float = 0.1
    pooling: str = "cls"
    initializer_range: float = 0.02
    pad_token_id: int | None = 0
    gate_theta_w: float | None = None
    gate_threshold: str = "relative"
    gate_rule: str = "max_only"
    gate_phi_w_factor: float = 0.5
    gate_dwell_kappa: float = 2.0
    gate_dwell_eps: float = 0.05
    gate_use_lambda_min_test: bool = True
    gate_use_dwell: bool = True
    gate_couple_trackers: bool = True
    gate_calibration_factor: float = 0.1
    gate_calibration_checks: int = 3
    gate_prune_factor: float = 0.05
    gate_prune_patience: int = 3
    gate_oja_step: float = 0.9
    gate_mca_step: float = 0.9
    gate_tracker_steps: int = 200
    gate_tracker_tolerance: float = 0.02
    gate_num_tokens: int = 512
    gate_check_every: int = 100
    gate_use_exact_eigh: bool = False
    bert_config: dict | None = None

    def __post_init__(self, **kwargs):
        for name in ("vocab_size", "hidden_size", "head_dim", "num_hidden_layers"):
            check_int(name, getattr(self, name), 1)
        heads = kwargs.pop("num_attention_heads", None)
        if heads is not None:
            if self.num_heads is not None and self.num_heads != heads:
                raise ValueError(f"`num_attention_heads` ({heads!r}) contradicts `num_heads` "
                                 f"({self.num_heads!r}): pass one of them")
            self.num_heads = heads
        if self.max_heads is None:
            if self.head_dim > self.hidden_size:
                raise ValueError(
                    f"`head_dim` ({self.head_dim}) must not exceed `hidden_size` ({self.hidden_size}) "
                    "when `max_heads` is left to its default hidden_size // head_dim"
                )
            self.max_heads = self.hidden_size // self.head_dim
        check_int("max_heads", self.max_heads, 1)
        self.num_heads = self._validated_num_heads(self.num_heads)
        self._validate_labels(kwargs)
        self._validate_transformers_fields()
        super().__post_init__(**kwargs)
        self._validate_fields()
        self._validate_problem_type()

    def __setattr__(self, key, value):
        """An int assigned to `num_heads` is expanded to every layer, as in the constructor."""
        layers = self.__dict__.get("num_hidden_layers")
        if (key == "num_heads" and isinstance(value, int) and not isinstance(value, bool)
                and isinstance(layers, int) and not isinstance(layers, bool)):
            value = [value] * layers
        super().__setattr__(key, value)

    @property
    def num_attention_heads(self) -> int:
        """transformers' name for the head count: the largest per-layer count in `num_heads`."""
        return max(self.num_heads)

    @num_attention_heads.setter
    def num_attention_heads(self, value: int) -> None:
        self.num_heads = value

    def validate(self) -> None:
        """transformers' checks, then every DDCL-INCRT field (fields assigned after construction included)."""
        super().validate()
        self._validate_transformers_fields()
        self._validate_fields()
        self._validate_labels({})
        self._validate_problem_type()

    def _validate_fields(self) -> None:
        minimums = {
            "vocab_size": 1, "hidden_size": 1, "num_hidden_layers": 1, "head_dim": 1, "num_prototypes": 2,
            "max_position_embeddings": 1, "type_vocab_size": 0, "gate_calibration_checks": 1,
            "gate_prune_patience": 1, "gate_tracker_steps": 1, "gate_num_tokens": 2, "gate_check_every": 1,
            "max_heads": 1,
        }
        for name, minimum in minimums.items():
            check_int(name, getattr(self, name), minimum)
        self._validated_num_heads(self.num_heads)
        check_float("tau_min", self.tau_min, low=TAU_FLOOR, high=TAU_CEILING)
        check_float("tau_init", self.tau_init, low=self.tau_min, high=TAU_CEILING, low_open=True)
        check_float("prototype_loss_weight", self.prototype_loss_weight, low=0.0,
                       high=PROTOTYPE_LOSS_WEIGHT_CEILING)
        check_float("layer_norm_eps", self.layer_norm_eps, low=LAYER_NORM_EPS_FLOOR)
        check_float("initializer_range", self.initializer_range, low=0.0, high=INITIALIZER_RANGE_CEILING,
                       low_open=True)
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            check_float(name, getattr(self, name), low=0.0, high=1.0, high_open=True)
        if self.pooling not in POOLING_MODES:
            raise ValueError(f"`pooling` must be one of {POOLING_MODES}, got {self.pooling!r}")
        self._validate_token_ids()
        if self.gate_threshold not in GATE_THRESHOLDS:
            raise ValueError(
                f"`gate_threshold` must be one of {GATE_THRESHOLDS}, got {self.gate_threshold!r}"
            )
        if self.gate_theta_w is not None:
            check_float("gate_theta_w", self.gate_theta_w, low=0.0, low_open=True)
        check_float("gate_calibration_factor", self.gate_calibration_factor, low=0.0, low_open=True)
        if self.gate_rule not in GATE_RULES:
            raise ValueError(f"`gate_rule` must be one of {GATE_RULES}, got {self.gate_rule!r}")
        check_float("gate_phi_w_factor", self.gate_phi_w_factor, low=-math.inf)
        check_float("gate_dwell_kappa", self.gate_dwell_kappa, low=0.0, low_open=True)
        check_float("gate_dwell_eps", self.gate_dwell_eps, low=0.0, high=1.0, low_open=True,
                    high_open=True)
        check_float("gate_prune_factor", self.gate_prune_factor, low=0.0)
        for name in ("gate_oja_step", "gate_mca_step", "gate_tracker_tolerance"):
            check_float(name, getattr(self, name), low=0.0, high=1.0, low_open=True)
        flags = ("gate_use_exact_eigh", "gate_use_lambda_min_test", "gate_use_dwell", "gate_couple_trackers")
        for name in flags:
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"`{name}` must be a bool, got {getattr(self, name)!r}")
        if self.bert_config is not None:
            self._validate_bert_config(self.bert_config)

    def _validate_token_ids(self) -> None:
        """Every `*_token_id` (transformers' too) is None or an int in [0, vocab_size); `eos_token_id` may
        also be a list of them, as generation allows."""
        fields = (*vars(self), *type(self).__dataclass_fields__)
        for name in sorted({name for name in fields if name.endswith("_token_id")}):
            value = getattr(self, name, None)
            entries = value if isinstance(value, list) and name == "eos_token_id" else [value]
            for entry in entries:
                if entry is None and entries is not value:
                    continue
                check_int(name, entry, 0)
                if entry >= self.vocab_size:
                    raise ValueError(f"`{name}` ({entry}) must be < `vocab_size` ({self.vocab_size})")

    def _validate_labels(self, kwargs: dict) -> None:
        """`id2label` maps label ids (ints, or decimal strings as in JSON) to names, `label2id` back."""
        if "num_labels" in kwargs:
            check_int("num_labels", kwargs["num_labels"], 1)
        id2label = kwargs.get("id2label", self.id2label)
        if id2label is not None:
            if not isinstance(id2label, dict) or not id2label:
                raise TypeError(f"`id2label` must be a non-empty dict {{label id: name}}, got {id2label!r}")
            for key, value in id2label.items():
                valid_key = (isinstance(key, int) and not isinstance(key, bool)) or (
                    isinstance(key, str) and key.isdigit())
                if not valid_key or not isinstance(value, str):
                    raise TypeError(f"`id2label` must map int label ids to str names, got {key!r}: {value!r}")
            if sorted(int(key) for key in id2label) != list(range(len(id2label))):
                raise ValueError(f"`id2label` keys must be 0 .. {len(id2label) - 1}, got {sorted(id2label)}")
        label2id = kwargs.get("label2id", self.label2id)
        if label2id is not None:
            if not isinstance(label2id, dict) or not all(
                isinstance(key, str) and isinstance(value, int) and not isinstance(value, bool)
                for key, value in label2id.items()
            ):
                raise TypeError(f"`label2id` must be a dict {{name: int label id}}, got {label2id!r}")

    def _validate_transformers_fields(self) -> None:
        """The fields `PreTrainedConfig` declares (it does not check them) must have their declared types."""
        for name in ("output_hidden_states", "return_dict", "is_encoder_decoder"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (value is None and name != "is_encoder_decoder"):
                raise TypeError(f"`{name}` must be a bool, got {value!r}")
        check_int("chunk_size_feed_forward", self.chunk_size_feed_forward, 0)
        architectures = self.architectures
        if architectures is not None and (
            not isinstance(architectures, list) or not all(isinstance(name, str) for name in architectures)
        ):
            raise TypeError(f"`architectures` must be a list of class names or None, got {architectures!r}")
        dtype = self.dtype
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype, dtype)
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise ValueError(f"`dtype` must be None, a torch.dtype or its name, got {self.dtype!r}")

    def _validate_problem_type(self) -> None:
        check_int("num_labels", self.num_labels, 1)
        if self.problem_type not in (None, *PROBLEM_TYPES):
            raise ValueError(
                f"`problem_type` must be None or one of {PROBLEM_TYPES}, got {self.problem_type!r}"
            )
        if self.problem_type == "single_label_classification" and self.num_labels < 2:
            raise ValueError("`problem_type='single_label_classification'` needs `num_labels` >= 2")

    def _validate_bert_config(self, bert_config) -> None:
        """`bert_config` must be a BERT config dict whose hidden_size matches (its encoder feeds layer 0)."""
        if not isinstance(bert_config, dict):
            raise TypeError(f"`bert_config` must be a dict (BertConfig.to_dict()) or None, got "
                            f"{type(bert_config).__name__}")
        if bert_config.get("model_type", "bert") != "bert":
            raise ValueError(f"`bert_config` must describe a BERT encoder, got model_type "
                             f"{bert_config['model_type']!r}")
        encoder_width = BertConfig.from_dict(bert_config).hidden_size
        if encoder_width != self.hidden_size:
            raise ValueError(f"`bert_config['hidden_size']` ({encoder_width}) must equal `hidden_size` "
                             f"({self.hidden_size})")

    def _validated_num_heads(self, num_heads) -> list[int]:
        """`num_heads` as a list with one count in [1, max_heads] per layer; an int is expanded."""
        if num_heads is None:
            num_heads = 1
        if isinstance(num_heads, int) and not isinstance(num_heads, bool):
            num_heads = [num_heads] * self.num_hidden_layers
        if not isinstance(num_heads, (list, tuple)):
            raise TypeError(f"`num_heads` must be an int or a list of ints, got {type(num_heads).__name__}")
        if len(num_heads) != self.num_hidden_layers:
            raise ValueError(f"`num_heads` has {len(num_heads)} entries but `num_hidden_layers` is "
                             f"{self.num_hidden_layers}")
        for layer, count in enumerate(num_heads):
            check_int(f"num_heads[{layer}]", count, 1)
            if count > self.max_heads:
                raise ValueError(f"`num_heads[{layer}]` = {count} exceeds `max_heads` = {self.max_heads}")
        return list(num_heads)


__all__ = ["DDCLIncrtConfig"]

"""Configuration of the DDL-mHC causal LM (docs/ddl_mhc.md): a Llama-shaped decoder whose residual stream is
`hc_streams` hyper-connection streams mixed by an exactly doubly-stochastic matrix and updated by the
Deep Delta rule. Every field, transformers' own included, is validated at construction and on every later
assignment, raising `ValueError`/`TypeError` that names the field."""

import math

import torch
from transformers import PreTrainedConfig
from transformers.activations import ACT2FN
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from geoformers.configuration.charts import METHODS, MHC_LITE_MAX_N
from geoformers.configuration.validation import (
    PROBLEM_TYPES,
    check_bool,
    check_choice,
    check_float,
    check_int,
)

HC_RES_MIXES = ("identity", "lazy")
RESIDUAL_UPDATES = ("delta", "add")
STREAM_EXPANSIONS = ("repeat", "conv")
HC_IMPLEMENTATIONS = ("fused", "reference")
MAX_SIZE = 2**24  # sizes; beyond, the checks themselves (rotary table, per-layer cache layout) take gigabytes
FLOAT32_TINY = torch.finfo(
    torch.float32
).tiny  # smallest normal float32: a smaller eps is 0 under flush-to-zero
MAX_GATE_INIT = 1e30  # gate x dynamic term (<= ~1e7 at any size here) stays a finite float32 logit


def _check_label_maps(id2label, label2id) -> None:
    """transformers' label maps: id -> name (JSON gives the ids as digit strings) and name -> id."""
    if id2label is not None:
        if not isinstance(id2label, dict):
            raise TypeError(f"`id2label` must be a dict {{id: name}} or None, got {type(id2label).__name__}")
        for key, label in id2label.items():
            digits = isinstance(key, str) and key.isascii() and key.removeprefix("-").isdigit()
            integer = isinstance(key, int) and not isinstance(key, bool)
            if not (digits or integer) or not isinstance(label, str):
                raise TypeError(f"`id2label` must map int ids to str names, got {key!r}: {label!r}")
        if len({int(key) for key in id2label}) != len(id2label):
            raise ValueError(f"`id2label` names one id twice (e.g. 0 and '0'): {id2label!r}")
    if label2id is not None:
        if not isinstance(label2id, dict):
            raise TypeError(f"`label2id` must be a dict {{name: id}} or None, got {type(label2id).__name__}")
        for label, key in label2id.items():
            if not isinstance(label, str) or isinstance(key, bool) or not isinstance(key, (int, str)):
                raise TypeError(f"`label2id` must map str names to int ids, got {label!r}: {key!r}")


def _check_dtype(name: str, value) -> None:
    if value is None or isinstance(value, torch.dtype):
        return
    if not isinstance(value, str) or not isinstance(getattr(torch, value, None), torch.dtype):
        raise ValueError(f"`{name}` must be None, a torch.dtype or its name (e.g. 'float32'), got {value!r}")


class DDLmHCConfig(PreTrainedConfig):
    r"""
    Decoder fields are Llama's (same names, same meaning), so a `LlamaConfig` maps field by field.
    The DDL-mHC fields (docs/ddl_mhc.md, 'Hyper-connections'):

    hc_streams (`int`, defaults to 4): number n of residual streams; the state is X in R^{n x hidden}.
    hc_chart (`str`, defaults to `"rtbp"`): doubly-stochastic chart for H_res, one of
        `"tbp"`, `"rtbp"`, `"sinkhorn"`, `"mhc_lite"` (n <= 6), `"kromhc"` (n a power of two), or the TBP-mHC
        authors' variants `"stbp"`, `"srtbp"`, `"mstbp"`, `"msrtbp"`, `"atbp"` (docs/chart_variants.md).
    hc_dynamic (`bool`, defaults to `True`): mixing maps (H_pre, H_res, H_post, beta) depend on the token
        (mHC: static bias + gated linear term of RMSNorm(flatten X)); `False` keeps one static set per
        sublayer.
    hc_res_mix_init (`float`, defaults to 0.05): initial a in H_res = (1 - a) I + a chart(t),
        a = sigmoid(learned).
    hc_res_mix (`str`, defaults to `"identity"`): `"identity"` mixes the chart with I as above; `"lazy"`
        (lazy-minorized) also with the uniform matrix J/n: H_res = (1 - lam - mu) I + lam chart(t) + mu J/n,
        (1 - lam - mu, lam, mu) = softmax of three learned logits, starting at lam = a (1 - mu), mu = 1e-4
        (docs/chart_variants.md, "Lazy-minorized mixing").
    hc_dynamic_gate_init (`float`, defaults to 0.01): initial gate alpha of the dynamic terms (mHC).
    residual (`str`, defaults to `"delta"`): `"delta"` (X' = H_res X (I - beta k k^T) + beta v k^T) or `"add"`
        (mHC, X' = H_res X + H_post^T h); `hc_streams=1, residual="add"` is exactly Llama.
    delta_beta_init (`float`, defaults to 1.0): beta at initialisation, in (0, 2).
    delta_eps (`float`, defaults to 1e-6): eps in k = h / sqrt(||h||^2 + eps^2).
    stream_expansion (`str`, defaults to `"repeat"`): embedding -> n streams by copying (`"repeat"`) or by
        DDL's identity-initialised causal depthwise convolution (`"conv"`, EC).
    stream_conv_kernel (`int`, defaults to 4): kernel size of the `"conv"` expansion.
    hc_implementation (`str`, defaults to `"fused"`): how the stream read/mix/write runs. `"fused"`: one
        autograd node per step with a hand-written backward (`fused_streams.py`); `"reference"`: the plain
        PyTorch autograd formulas. Both compute the same function (tests compare them); read at build time.

    Validation. Every field is checked at construction and again on every assignment afterwards
    (`config.hidden_size = 15` raises and leaves the config unchanged), the fields of `PreTrainedConfig`
    included (label maps, `*_token_id`, `dtype`, `problem_type`, flags). Fields that are only valid together
    (e.g. `hidden_size` and `num_attention_heads`) can be changed at once with `config.update({...})`, which
    validates once. `rope_theta` and `rope_parameters` stay in step: assigning one updates the other, and
    `rope_parameters` must build the model's rotary embedding (any transformers RoPE type). Bounds: sizes in
    [1, 2^24]; `rms_norm_eps` any finite value >= 2^-126 (the smallest normal float32) and `delta_eps`
    any finite value with `delta_eps`^2 >= 2^-126, so neither rounds to 0; `hc_dynamic_gate_init` in
    [0, 1e30] so that gated logits stay finite in float32. An in-place change of a mutable field
    (`config.rope_parameters["factor"] = ...`) is not seen: assign a new value instead.
    """

    model_type = "ddl_mhc"

    vocab_size: int = 32000
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    rope_parameters: dict | None = None  # transformers' RoPE dict; its "rope_theta", when given, wins
    attention_bias: bool = False
    attention_dropout: float = 0.0
    mlp_bias: bool = False

    hc_streams: int = 4
    hc_chart: str = "rtbp"
    hc_dynamic: bool = True
    hc_res_mix_init: float = 0.05
    hc_res_mix: str = "identity"
    hc_dynamic_gate_init: float = 0.01
    residual: str = "delta"
    delta_beta_init: float = 1.0
    delta_eps: float = 1e-6
    stream_expansion: str = "repeat"
    stream_conv_kernel: int = 4
    hc_implementation: str = "fused"

    def __post_init__(self, **kwargs):
        # What transformers' own __post_init__ would trip over with an error that names nothing
        _check_label_maps(self.id2label, self.label2id)
        _check_dtype("dtype", self.dtype)
        _check_dtype("torch_dtype", kwargs.get("torch_dtype"))
        if kwargs.get("num_labels") is not None:
            check_int("num_labels", kwargs["num_labels"], 0, MAX_SIZE)
        if self.rope_parameters is not None and not isinstance(self.rope_parameters, dict):
            raise TypeError(
                f"`rope_parameters` must be a dict or None, got {type(self.rope_parameters).__name__}"
            )
        check_float("rope_theta", self.rope_theta, 0.0, math.inf, True, True)
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.rope_parameters is not None and "rope_theta" in self.rope_parameters:
            theta = self.rope_parameters["rope_theta"]
            check_float("rope_parameters['rope_theta']", theta, 0.0, math.inf, True, True)
            self.rope_theta = theta
        self._validate_decoder()  # sizes first: transformers' __post_init__ reads `layer_types`
        self._validate_hyper_connections()
        super().__post_init__(**kwargs)
        self._validate()

    def __setattr__(self, name: str, value) -> None:
        """After construction, a field assignment is validated with the whole config and undone if invalid."""
        if name == "num_labels":  # transformers' property: builds `id2label` from it
            check_int("num_labels", value, 0, MAX_SIZE)
        state = self.__dict__
        watched = name in self.__dataclass_fields__ or name.endswith("_token_id") or name == "head_dim"
        if not watched or not state.get("_post_init_done", False) or state.get(name, self) is value:
            super().__setattr__(name, value)
            return
        before = dict(state)
        super().__setattr__(name, value)
        try:
            self._normalise(name)
            self._validate()
        except (TypeError, ValueError):
            state.clear()
            state.update(before)
            raise

    def update(self, config_dict: dict) -> None:
        """Set several fields, then validate once (fields valid only together); nothing changes if invalid."""
        state = self.__dict__
        before = dict(state)
        try:
            state["_post_init_done"] = False  # plain assignments, as during construction
            for name, value in config_dict.items():
                setattr(self, name, value)
                self._normalise(name)
            state["_post_init_done"] = True
            self._validate()
        except (TypeError, ValueError):
            state.clear()
            state.update(before)
            raise
        finally:
            state["_post_init_done"] = before.get("_post_init_done", True)

    def _normalise(self, name: str) -> None:
        """What construction does to an assigned value: `rope_theta` and `rope_parameters["rope_theta"]`
        kept equal, `id2label` keys as ints (None: the two default labels) and `label2id` its inverse."""
        if name == "id2label":
            labels = self.__dict__["id2label"]
            _check_label_maps(labels, None)
            labels = (
                {0: "LABEL_0", 1: "LABEL_1"} if labels is None else {int(k): v for k, v in labels.items()}
            )
            self.__dict__["id2label"] = labels
            self.__dict__["label2id"] = {label: key for key, label in labels.items()}
        rope = self.__dict__.get("rope_parameters")
        if name == "rope_theta" and isinstance(rope, dict):
            self.__dict__["rope_parameters"] = {**rope, "rope_theta": self.rope_theta}
        elif name == "rope_parameters" and (rope is None or isinstance(rope, dict)):
            rope = dict(rope or {})
            rope.setdefault("rope_type", rope.get("type", "default"))
            rope.setdefault("rope_theta", self.rope_theta)
            check_float("rope_parameters['rope_theta']", rope["rope_theta"], 0.0, math.inf, True, True)
            self.__dict__["rope_parameters"] = rope
            self.__dict__["rope_theta"] = rope["rope_theta"]

    def _validate(self) -> None:
        self._validate_transformers_fields()
        self._validate_decoder()
        self._validate_hyper_connections()
        self._validate_rope()

    @property
    def layer_types(self) -> list[str]:
        """Cache layout read by `DynamicCache(config=...)`: with the EC expansion, layer 0's cache also holds
        the convolution state ("hybrid" = key/value + conv state), so incremental decoding sees the same
        left context as the full forward pass."""
        has_conv_state = self.stream_expansion == "conv" and self.stream_conv_kernel > 1
        first = "hybrid" if has_conv_state else "full_attention"
        return [first] + ["full_attention"] * (self.num_hidden_layers - 1)

    def _validate_transformers_fields(self) -> None:
        """The fields `PreTrainedConfig` owns, and every special token id (`*_token_id`)."""
        _check_label_maps(self.id2label, self.label2id)
        _check_dtype("dtype", self.dtype)
        for name in ("output_hidden_states", "return_dict", "is_encoder_decoder"):
            check_bool(name, getattr(self, name))
        check_int("chunk_size_feed_forward", self.chunk_size_feed_forward, 0, MAX_SIZE)
        if self.problem_type is not None:
            check_choice("problem_type", self.problem_type, PROBLEM_TYPES)
        if self.architectures is not None and (
            not isinstance(self.architectures, list)
            or not all(isinstance(a, str) for a in self.architectures)
        ):
            raise TypeError(
                f"`architectures` must be a list of class names or None, got {self.architectures!r}"
            )
        if self.transformers_version is not None and not isinstance(self.transformers_version, str):
            raise TypeError(
                f"`transformers_version` must be a str or None, got {self.transformers_version!r}"
            )
        check_int("vocab_size", self.vocab_size, 1, MAX_SIZE)
        for name in sorted(key for key in self.__dict__ if key.endswith("_token_id")):
            token_id = self.__dict__[name]
            if token_id is None:
                continue
            several = name == "eos_token_id" and isinstance(token_id, list) and token_id  # generation: any
            for value in token_id if several else [token_id]:
                if isinstance(value, bool) or not isinstance(value, int):
                    kind = (
                        "a token id or a non-empty list of them" if name == "eos_token_id" else "a token id"
                    )
                    raise TypeError(f"`{name}` must be None or {kind}, got {token_id!r}")
                if not 0 <= value < self.vocab_size:
                    raise ValueError(
                        f"`{name}` ({token_id}) must lie in [0, `vocab_size` = {self.vocab_size})"
                    )

    def _validate_decoder(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"):
            check_int(name, getattr(self, name), 1, MAX_SIZE)
        for name in ("num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            check_int(name, getattr(self, name), 1, MAX_SIZE)
        if "head_dim" in self.__dict__:  # optional, as in Llama; absent: hidden_size // num_attention_heads
            head_dim = self.__dict__["head_dim"]
            check_int("head_dim", head_dim, 2, MAX_SIZE)
            if head_dim % 2:
                raise ValueError(f"`head_dim` must be even for rotary embeddings, got {head_dim}")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"`hidden_size` ({self.hidden_size}) must be divisible by `num_attention_heads` "
                f"({self.num_attention_heads})"
            )
        if (self.hidden_size // self.num_attention_heads) % 2 != 0:
            raise ValueError(
                f"`hidden_size` / `num_attention_heads` = {self.hidden_size // self.num_attention_heads} "
                "must be even for rotary embeddings"
            )
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"`num_attention_heads` ({self.num_attention_heads}) must be divisible by "
                f"`num_key_value_heads` ({self.num_key_value_heads})"
            )
        if not isinstance(self.hidden_act, str) or self.hidden_act not in ACT2FN:
            raise ValueError(f"`hidden_act` must be an ACT2FN name of transformers, got {self.hidden_act!r}")
        check_float("rope_theta", self.rope_theta, 0.0, math.inf, True, True)
        check_float("rms_norm_eps", self.rms_norm_eps, FLOAT32_TINY, math.inf, False, True)
        check_float("initializer_range", self.initializer_range, 0.0, 1.0, True, False)
        check_float("attention_dropout", self.attention_dropout, 0.0, 1.0, False, True)
        for name in ("use_cache", "tie_word_embeddings", "attention_bias", "mlp_bias"):
            check_bool(name, getattr(self, name))

    def _validate_rope(self) -> None:
        """`rope_parameters` (after transformers' standardisation) must build the model's rotary embedding
        with finite, positive inverse frequencies."""
        rope = self.rope_parameters
        if not isinstance(rope, dict):
            raise TypeError(f"`rope_parameters` must be a dict or None, got {type(rope).__name__}")
        if any(isinstance(value, dict) for value in rope.values()):
            raise ValueError("`rope_parameters` must be one dict for all layers (no per-layer-type dicts)")
        rope_type = rope.get("rope_type")
        if rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS:
            raise ValueError(
                f"`rope_parameters['rope_type']` must be one of {['default', *ROPE_INIT_FUNCTIONS]}, "
                f"got {rope_type!r}"
            )
        check_float("rope_parameters['rope_theta']", rope.get("rope_theta"), 0.0, math.inf, True, True)
        try:
            self.validate_rope()
            rotary = LlamaRotaryEmbedding(self)
        except (
            KeyError,
            TypeError,
            ValueError,
            ArithmeticError,
            AttributeError,
            IndexError,
            RuntimeError,
        ) as err:
            raise ValueError(f"`rope_parameters` {rope} cannot build a rotary embedding: {err!r}") from err
        inv_freq, scaling = rotary.inv_freq, rotary.attention_scaling
        if not (
            torch.isfinite(inv_freq).all() and (inv_freq > 0).all() and math.isfinite(scaling) and scaling > 0
        ):
            raise ValueError(
                f"`rope_parameters` {rope} (`rope_theta` = {self.rope_theta}) give non-finite or "
                "non-positive rotary frequencies or scaling in float32"
            )

    def _validate_hyper_connections(self) -> None:
        check_int("hc_streams", self.hc_streams, 1, MAX_SIZE)
        check_choice("hc_chart", self.hc_chart, METHODS)
        n = self.hc_streams
        if self.hc_chart == "kromhc" and n & (n - 1) != 0:
            raise ValueError(f"`hc_chart`='kromhc' needs `hc_streams` to be a power of two, got {n}")
        if self.hc_chart == "mhc_lite" and n > MHC_LITE_MAX_N:
            raise ValueError(
                f"`hc_chart`='mhc_lite' enumerates n! permutations: `hc_streams` must be <= "
                f"{MHC_LITE_MAX_N}, got {n}"
            )
        check_bool("hc_dynamic", self.hc_dynamic)
        check_float("hc_res_mix_init", self.hc_res_mix_init, 0.0, 1.0, True, True)
        check_choice("hc_res_mix", self.hc_res_mix, HC_RES_MIXES)
        check_float("hc_dynamic_gate_init", self.hc_dynamic_gate_init, 0.0, MAX_GATE_INIT, False, False)
        check_choice("residual", self.residual, RESIDUAL_UPDATES)
        check_float("delta_beta_init", self.delta_beta_init, 0.0, 2.0, True, True)
        check_float("delta_eps", self.delta_eps, math.sqrt(FLOAT32_TINY), math.inf, False, True)
        check_choice("stream_expansion", self.stream_expansion, STREAM_EXPANSIONS)
        check_int("stream_conv_kernel", self.stream_conv_kernel, 1, MAX_SIZE)
        check_choice("hc_implementation", self.hc_implementation, HC_IMPLEMENTATIONS)


__all__ = ["DDLmHCConfig"]

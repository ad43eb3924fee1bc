"""Configuration of the DDL-mHC causal LM (docs/ddl_mhc.md): a Llama-shaped decoder whose residual stream is
`hc_streams` hyper-connection streams mixed by an exactly doubly-stochastic matrix and updated by the
Deep Delta rule. Validated as both configurations are (`configuration/validation.py`)."""

# first: a transformers outside the supported range fails here, naming both (docs/versions.md)
from geoformers.modeling.transformers_range import TRANSFORMERS_REQUIREMENT  # noqa: F401

# isort: split

import math
from typing import Literal

import torch
from transformers import AutoModelForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.utils.type_validators import activation_fn_key

from geoformers.configuration.architecture_names import name_architecture
from geoformers.configuration.charts import METHODS, MHC_LITE_MAX_N
from geoformers.configuration.validation import (
    MAX_SIZE,
    ValidatedConfig,
    check_number,
    layers,
    number,
    size,
    strict_config,
)

Chart = Literal[METHODS]
FLOAT32_TINY = torch.finfo(torch.float32).tiny  # smallest normal float32: a smaller eps is 0 (flush-to-zero)
MAX_GATE_INIT = 1e30  # gate x dynamic term (<= ~1e7 at any size here) stays a finite float32 logit
positive = number(0.0, math.inf, low_open=True, high_open=True)


@strict_config
class DDLmHCConfig(ValidatedConfig):
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

    How the ops run is not configured: the tensors choose (docs/ddl_mhc.md, 'Choosing a path'). A saved
    config.json with the former field `hc_implementation` loads; the field is dropped.

    Validation (docs/reliability.md, 'Configs'): each field's type and range when it is set (an invalid value
    is not stored), the fields that must agree (`hidden_size` and the head counts, `hc_chart` and
    `hc_streams`, the token ids and `vocab_size`, `rope_parameters`) at construction, at model build and at
    `save_pretrained`. `rope_theta` and `rope_parameters` stay in step: assigning one updates the other, and
    `rope_parameters` must build the model's rotary embedding (any transformers RoPE type). Bounds: sizes in
    [1, 2^24], layers at most 2^14; `rms_norm_eps` any finite value >= 2^-126 (the smallest normal float32)
    and `delta_eps` any finite value with `delta_eps`^2 >= 2^-126, so neither rounds to 0;
    `hc_dynamic_gate_init` in [0, 1e30] so that gated logits stay finite in float32.
    """

    model_type = "ddl_mhc"

    vocab_size: int = size(default=32000)
    hidden_size: int = size(default=256)
    intermediate_size: int = size(default=688)
    num_hidden_layers: int = layers(default=4)
    num_attention_heads: int = size(default=4)
    num_key_value_heads: int | None = size(default=None)
    hidden_act: str = activation_fn_key(default="silu")
    max_position_embeddings: int = size(default=2048)
    initializer_range: int | float = number(0.0, 1.0, low_open=True)(default=0.02)
    rms_norm_eps: int | float = number(FLOAT32_TINY, math.inf, high_open=True)(default=1e-6)
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    tie_word_embeddings: bool = False
    rope_theta: int | float = positive(default=10000.0)
    rope_parameters: dict | None = None  # transformers' RoPE dict; its "rope_theta", when given, wins
    attention_bias: bool = False
    attention_dropout: int | float = number(0.0, 1.0, high_open=True)(default=0.0)
    mlp_bias: bool = False

    hc_streams: int = size(default=4)
    hc_chart: Chart = "rtbp"
    hc_dynamic: bool = True
    hc_res_mix_init: int | float = number(0.0, 1.0, low_open=True, high_open=True)(default=0.05)
    hc_res_mix: Literal["identity", "lazy"] = "identity"
    hc_dynamic_gate_init: int | float = number(0.0, MAX_GATE_INIT)(default=0.01)
    residual: Literal["delta", "add"] = "delta"
    delta_beta_init: int | float = number(0.0, 2.0, low_open=True, high_open=True)(default=1.0)
    delta_eps: int | float = number(math.sqrt(FLOAT32_TINY), math.inf, high_open=True)(default=1e-6)
    stream_expansion: Literal["repeat", "conv"] = "repeat"
    stream_conv_kernel: int = size(default=4)

    def __post_init__(self, **kwargs):
        kwargs.pop("hc_implementation", None)  # a former field: the tensors choose the path now
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.rope_parameters is not None and "rope_theta" in self.rope_parameters:
            theta = self.rope_parameters["rope_theta"]
            check_number("rope_parameters['rope_theta']", theta, 0.0, math.inf, low_open=True, high_open=True)
            self.rope_theta = theta
        super().__post_init__(**kwargs)

    def __setattr__(self, name: str, value) -> None:
        """After construction, `rope_theta` and `rope_parameters["rope_theta"]` are kept equal."""
        super().__setattr__(name, value)
        if not self.__dict__.get("_post_init_done", False):
            return
        rope = self.rope_parameters
        if name == "rope_theta" and isinstance(rope, dict) and rope.get("rope_theta") != value:
            super().__setattr__("rope_parameters", {**rope, "rope_theta": value})
        elif name == "rope_parameters" and (rope is None or isinstance(rope, dict)):
            rope = rope or {}
            rope = {"rope_type": rope.get("type", "default"), "rope_theta": self.rope_theta, **rope}
            super().__setattr__("rope_parameters", rope)
            super().__setattr__("rope_theta", rope["rope_theta"])

    @property
    def layer_types(self) -> list[str]:
        """Cache layout read by `DynamicCache(config=...)`: with the EC expansion, layer 0's cache also holds
        the convolution state ("hybrid" = key/value + conv state), so incremental decoding sees the same
        left context as the full forward pass."""
        has_conv_state = self.stream_expansion == "conv" and self.stream_conv_kernel > 1
        first = "hybrid" if has_conv_state else "full_attention"
        return [first] + ["full_attention"] * (self.num_hidden_layers - 1)

    def validate_architecture(self) -> None:
        """Heads divide the width, the rotary head width is even, and the chart fits `hc_streams`."""
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"`hidden_size` ({self.hidden_size}) must be divisible by `num_attention_heads` "
                f"({self.num_attention_heads})"
            )
        if "head_dim" in self.__dict__:  # optional, as in Llama; absent: hidden_size // num_attention_heads
            check_number("head_dim", self.head_dim, 2, MAX_SIZE, integer=True)
        head_dim = self.__dict__.get("head_dim", self.hidden_size // self.num_attention_heads)
        if head_dim % 2 != 0:
            name = "`head_dim`" if "head_dim" in self.__dict__ else "`hidden_size` / `num_attention_heads`"
            raise ValueError(f"{name} = {head_dim} must be even for rotary embeddings")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"`num_attention_heads` ({self.num_attention_heads}) must be divisible by "
                f"`num_key_value_heads` ({self.num_key_value_heads})"
            )
        n = self.hc_streams
        if self.hc_chart == "kromhc" and n & (n - 1) != 0:
            raise ValueError(f"`hc_chart`='kromhc' needs `hc_streams` to be a power of two, got {n}")
        if self.hc_chart == "mhc_lite" and n > MHC_LITE_MAX_N:
            raise ValueError(
                f"`hc_chart`='mhc_lite' enumerates n! permutations: `hc_streams` must be <= "
                f"{MHC_LITE_MAX_N}, got {n}"
            )

    def validate_rope(self) -> None:
        """transformers' RoPE checks, then `rope_parameters` must build the model's rotary embedding with
        finite, positive inverse frequencies."""
        rope = self.rope_parameters
        if any(isinstance(value, dict) for value in rope.values()):
            raise ValueError("`rope_parameters` must be one dict for all layers (no per-layer-type dicts)")
        rope_type = rope.get("rope_type")
        if rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS:
            raise ValueError(
                f"`rope_parameters['rope_type']` must be one of {['default', *ROPE_INIT_FUNCTIONS]}, "
                f"got {rope_type!r}"
            )
        try:
            super().validate_rope()
            with torch.device("cpu"):  # also when a model is built on the meta device (from_pretrained)
                rotary = LlamaRotaryEmbedding(self)
        except (ArithmeticError, AttributeError, LookupError, RuntimeError, TypeError, ValueError) as e:
            raise ValueError(f"`rope_parameters` {rope} cannot build a rotary embedding: {e!r}") from e
        inv_freq, scaling = rotary.inv_freq, rotary.attention_scaling
        if not (
            torch.isfinite(inv_freq).all() and (inv_freq > 0).all() and math.isfinite(scaling) and scaling > 0
        ):
            raise ValueError(
                f"`rope_parameters` {rope} (`rope_theta` = {self.rope_theta}) give non-finite or "
                "non-positive rotary frequencies or scaling in float32"
            )


name_architecture("DDLmHCForCausalLM", AutoModelForCausalLM)

__all__ = ["DDLmHCConfig"]

"""Configuration of the DDL-mHC causal LM (docs/ddl_mhc.md): a Llama-shaped decoder whose residual stream is
`hc_streams` hyper-connection streams mixed by an exactly doubly-stochastic matrix and updated by the
Deep Delta rule. Validated as both configurations are (`models/config_validation.py`)."""

# first: a transformers outside the supported range fails here, naming both (docs/versions.md)
from geoformers.models.transformers_range import TRANSFORMERS_REQUIREMENT  # noqa: F401

# isort: split

import math
from typing import Literal

import torch
from transformers import AutoModelForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, RopeParameters
from transformers.utils.type_validators import activation_fn_key, interval

from geoformers.models.architecture_names import name_architecture
from geoformers.models.config_validation import (
    MAX_FLOAT,
    MAX_SIZE,
    ValidatedConfig,
    check_number,
    layers,
    optional,
    size,
    strict_config,
)
from geoformers.models.ddl_mhc.chart_specs import METHODS, MHC_LITE_MAX_N

Chart = Literal[METHODS]
FLOAT32_TINY = torch.finfo(torch.float32).tiny  # smallest normal float32: a smaller eps is 0 (flush-to-zero)
FLOAT32_MAX = torch.finfo(torch.float32).max
MAX_GATE_INIT = 1e30  # gate x dynamic term (<= ~1e7 at any size here) stays a finite float32 logit
ROPE_TYPES = ("default", *ROPE_INIT_FUNCTIONS)
ROPE_FLAGS = ("rope_type", "type", "truncate")  # the `rope_parameters` entries that are not numbers


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

    Validation (docs/reliability.md, 'Configs'): each field's type and range whenever it is set, and the
    fields that must agree (`hidden_size` and the head counts, `hc_chart` and `hc_streams`, `pad_token_id` and
    `vocab_size`, `rope_parameters`, the size of the model) at construction, on every assignment and `update`
    (a refused one is undone), at model build and at `save_pretrained`. RoPE is transformers' (`rope_theta`
    lives in `rope_parameters`; any transformers RoPE type). Bounds: sizes in [1, 2^24], layers at most 2^14,
    no weight above 2^32 elements; `rms_norm_eps` any finite value >= 2^-126 (the smallest normal float32)
    and `delta_eps` any finite value with `delta_eps`^2 >= 2^-126, so neither rounds to 0;
    `hc_dynamic_gate_init` in [0, 1e30] so that gated logits stay finite in float32.
    """

    model_type = "ddl_mhc"

    vocab_size: int = size(default=32000)
    hidden_size: int = size(default=256)
    intermediate_size: int = size(default=688)
    num_hidden_layers: int = layers(default=4)
    num_attention_heads: int = size(default=4)
    num_key_value_heads: int | None = optional(size)(default=None)
    hidden_act: str = activation_fn_key(default="silu")
    max_position_embeddings: int = size(default=2048)
    initializer_range: int | float = interval(min=0.0, max=1.0, exclude_min=True)(default=0.02)
    rms_norm_eps: int | float = interval(min=FLOAT32_TINY, max=MAX_FLOAT)(default=1e-6)
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    tie_word_embeddings: bool = False
    rope_parameters: RopeParameters | dict | None = None
    attention_bias: bool = False
    attention_dropout: int | float = interval(min=0.0, max=1.0, exclude_max=True)(default=0.0)
    mlp_bias: bool = False

    hc_streams: int = size(default=4)
    hc_chart: Chart = "rtbp"
    hc_dynamic: bool = True
    hc_res_mix_init: int | float = interval(min=0.0, max=1.0, exclude_min=True, exclude_max=True)(
        default=0.05
    )
    hc_res_mix: Literal["identity", "lazy"] = "identity"
    hc_dynamic_gate_init: int | float = interval(min=0.0, max=MAX_GATE_INIT)(default=0.01)
    residual: Literal["delta", "add"] = "delta"
    delta_beta_init: int | float = interval(min=0.0, max=2.0, exclude_min=True, exclude_max=True)(default=1.0)
    delta_eps: int | float = interval(min=math.sqrt(FLOAT32_TINY), max=MAX_FLOAT)(default=1e-6)
    stream_expansion: Literal["repeat", "conv"] = "repeat"
    stream_conv_kernel: int = size(default=4)

    def __post_init__(self, **kwargs):
        kwargs.pop("hc_implementation", None)  # a former field: the tensors choose the path now
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        super().__post_init__(**kwargs)

    def __setattr__(self, name: str, value) -> None:
        """An assigned `rope_parameters` (None or one dict for all layers) is standardised as at construction
        (`rope_type`, `rope_theta`)."""
        super().__setattr__(name, value)
        if name != "rope_parameters" or not self.__dict__.get("_post_init_done"):
            return
        flat = value is None or not any(isinstance(entry, dict) for entry in value.values())
        if flat and not (value and {"rope_type", "rope_theta"} <= value.keys()):
            self.standardize_rope_params()

    @property
    def rope_theta(self) -> float:
        """The RoPE base, kept in `rope_parameters` as in transformers' configs (a `rope_theta` argument or
        config.json key moves there); assigning it updates `rope_parameters`."""
        return (self.rope_parameters or {}).get("rope_theta", self.default_theta)

    @rope_theta.setter
    def rope_theta(self, value: float) -> None:
        self.rope_parameters = {**(self.rope_parameters or {}), "rope_theta": value}

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
        if self.num_key_value_heads is None:  # resolved at construction only, as in Llama
            raise ValueError("`num_key_value_heads` must be a head count once the config is built, got None")
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
        """transformers' RoPE checks (`RotaryEmbeddingConfigMixin.validate_rope`: the keys each `rope_type`
        needs), with what it only warns about made errors: a `rope_type` transformers implements, one dict for
        all layers, finite numbers, `rope_theta` a normal float32 (its inverse powers stay finite) and
        `factor` >= 1."""
        rope = self.rope_parameters
        if not isinstance(rope, dict) or rope.get("rope_type") not in ROPE_TYPES:
            got = rope.get("rope_type") if isinstance(rope, dict) else rope
            raise ValueError(f"`rope_parameters['rope_type']` must be one of {list(ROPE_TYPES)}, got {got!r}")
        for key, value in rope.items():
            numbers = value if isinstance(value, list) and key != "rope_theta" else [value]
            if key not in ROPE_FLAGS and not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and -MAX_FLOAT <= x <= MAX_FLOAT
                for x in numbers
            ):
                raise ValueError(
                    f"`rope_parameters['{key}']` must be a finite number (or list of them), got {value!r}"
                )
        check_number("rope_parameters['rope_theta']", rope["rope_theta"], FLOAT32_TINY, FLOAT32_MAX)
        if "factor" in rope:
            check_number("rope_parameters['factor']", rope["factor"], 1.0)
        try:
            super().validate_rope()
        except KeyError as error:  # transformers' missing-key error
            raise ValueError(f"`rope_parameters` {rope}: {error.args[0]}") from None

    def weight_sizes(self) -> dict[str, int]:
        """The embedding (and untied head), the attention, MLP and hyper-connection projections
        (docs/ddl_mhc.md, 'Hyper-connections'); the chart logits are at most n^2, or n! for "mhc_lite"."""
        d, n, heads = self.hidden_size, self.hc_streams, self.num_attention_heads
        head_dim = self.__dict__.get("head_dim", d // heads)
        logits = math.factorial(n) if self.hc_chart == "mhc_lite" else n * n
        embedding = self.vocab_size * d
        attention = d * head_dim * (2 * heads + 2 * self.num_key_value_heads)
        mlp = 3 * d * self.intermediate_size
        maps = n * d * (logits + 2 * n) if self.hc_dynamic else 0
        layer = attention + mlp + 2 * maps
        return {
            "`vocab_size` x `hidden_size`": embedding,
            "`hidden_size` x `intermediate_size`": d * self.intermediate_size,
            "`hidden_size` x `num_attention_heads` x head width": d * heads * head_dim,
            "`hc_streams` x `hidden_size` x the chart logits": n * d * logits,
            "`hidden_size` x `hc_streams` x `stream_conv_kernel`": d * n * self.stream_conv_kernel,
            "parameters (`num_hidden_layers` x `hidden_size` x (`intermediate_size`, `hc_streams`, ...) + "
            "`vocab_size` x `hidden_size`)": self.num_hidden_layers * layer
            + embedding * (1 if self.tie_word_embeddings else 2),
        }


name_architecture("DDLmHCForCausalLM", AutoModelForCausalLM)

__all__ = ["DDLmHCConfig"]

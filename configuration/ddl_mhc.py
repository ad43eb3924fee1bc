"""Configuration of the DDL-mHC causal LM (DESIGN §2): a Llama-shaped decoder whose residual stream is
`hc_streams` hyper-connection streams mixed by an exactly doubly-stochastic matrix and updated by the
Deep Delta rule. Every field is validated here, raising `ValueError`/`TypeError` that names the field."""

import math

from transformers import PreTrainedConfig
from transformers.activations import ACT2FN

HC_CHARTS = ("tbp", "rtbp", "sinkhorn", "mhc_lite", "kromhc")
RESIDUAL_UPDATES = ("delta", "add")
STREAM_EXPANSIONS = ("repeat", "conv")
HC_IMPLEMENTATIONS = ("fused", "reference")
MHC_LITE_MAX_STREAMS = 6  # mhc_lite enumerates all n! permutation matrices (DESIGN §1)


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {value}")


def _check_float(name: str, value, low: float, high: float, low_open: bool, high_open: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a number, got {type(value).__name__} ({value!r})")
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if too_low or too_high or math.isnan(value):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"`{name}` must lie in {interval}, got {value}")


def _check_choice(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {list(choices)}, got {value!r}")


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be a bool, got {type(value).__name__} ({value!r})")


class DDLmHCConfig(PreTrainedConfig):
    r"""
    Decoder fields are Llama's (same names, same meaning), so a `LlamaConfig` maps field by field.
    The DDL-mHC fields (DESIGN §2):

    hc_streams (`int`, defaults to 4): number n of residual streams; the state is X in R^{n x hidden}.
    hc_chart (`str`, defaults to `"rtbp"`): doubly-stochastic chart for H_res, one of
        `"tbp"`, `"rtbp"`, `"sinkhorn"`, `"mhc_lite"` (n <= 6), `"kromhc"` (n a power of two).
    hc_dynamic (`bool`, defaults to `True`): mixing maps (H_pre, H_res, H_post, beta) depend on the token
        (mHC: static bias + gated linear term of RMSNorm(flatten X)); `False` keeps one static set per
        sublayer.
    hc_res_mix_init (`float`, defaults to 0.05): initial a in H_res = (1 - a) I + a chart(t),
        a = sigmoid(learned).
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
    hc_dynamic_gate_init: float = 0.01
    residual: str = "delta"
    delta_beta_init: float = 1.0
    delta_eps: float = 1e-6
    stream_expansion: str = "repeat"
    stream_conv_kernel: int = 4
    hc_implementation: str = "fused"

    def __post_init__(self, **kwargs):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.rope_parameters is not None and "rope_theta" in self.rope_parameters:
            self.rope_theta = self.rope_parameters["rope_theta"]
        self._validate_decoder()
        self._validate_hyper_connections()
        super().__post_init__(**kwargs)

    @property
    def layer_types(self) -> list[str]:
        """Cache layout read by `DynamicCache(config=...)`: with the EC expansion, layer 0's cache also holds
        the convolution state ("hybrid" = key/value + conv state), so incremental decoding sees the same
        left context as the full forward pass."""
        has_conv_state = self.stream_expansion == "conv" and self.stream_conv_kernel > 1
        first = "hybrid" if has_conv_state else "full_attention"
        return [first] + ["full_attention"] * (self.num_hidden_layers - 1)

    def _validate_decoder(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"):
            _check_int(name, getattr(self, name), 1)
        for name in ("num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            _check_int(name, getattr(self, name), 1)
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
        if self.hidden_act not in ACT2FN:
            raise ValueError(f"`hidden_act` must be an ACT2FN name of transformers, got {self.hidden_act!r}")
        _check_float("rope_theta", self.rope_theta, 0.0, math.inf, True, True)
        _check_float("rms_norm_eps", self.rms_norm_eps, 0.0, 1.0, True, True)
        _check_float("initializer_range", self.initializer_range, 0.0, 1.0, True, False)
        _check_float("attention_dropout", self.attention_dropout, 0.0, 1.0, False, True)
        for name in ("use_cache", "tie_word_embeddings", "attention_bias", "mlp_bias"):
            _check_bool(name, getattr(self, name))
        for name in ("pad_token_id", "bos_token_id"):
            token_id = getattr(self, name)
            if token_id is not None:
                _check_int(name, token_id, 0)
                if token_id >= self.vocab_size:
                    raise ValueError(f"`{name}` ({token_id}) must be < `vocab_size` ({self.vocab_size})")

    def _validate_hyper_connections(self) -> None:
        _check_int("hc_streams", self.hc_streams, 1)
        _check_choice("hc_chart", self.hc_chart, HC_CHARTS)
        n = self.hc_streams
        if self.hc_chart == "kromhc" and n & (n - 1) != 0:
            raise ValueError(f"`hc_chart`='kromhc' needs `hc_streams` to be a power of two, got {n}")
        if self.hc_chart == "mhc_lite" and n > MHC_LITE_MAX_STREAMS:
            raise ValueError(
                f"`hc_chart`='mhc_lite' enumerates n! permutations: `hc_streams` must be <= "
                f"{MHC_LITE_MAX_STREAMS}, got {n}"
            )
        _check_bool("hc_dynamic", self.hc_dynamic)
        _check_float("hc_res_mix_init", self.hc_res_mix_init, 0.0, 1.0, True, True)
        _check_float("hc_dynamic_gate_init", self.hc_dynamic_gate_init, 0.0, math.inf, False, True)
        _check_choice("residual", self.residual, RESIDUAL_UPDATES)
        _check_float("delta_beta_init", self.delta_beta_init, 0.0, 2.0, True, True)
        _check_float("delta_eps", self.delta_eps, 0.0, 1.0, True, False)
        _check_choice("stream_expansion", self.stream_expansion, STREAM_EXPANSIONS)
        _check_int("stream_conv_kernel", self.stream_conv_kernel, 1)
        _check_choice("hc_implementation", self.hc_implementation, HC_IMPLEMENTATIONS)


__all__ = ["DDLmHCConfig"]

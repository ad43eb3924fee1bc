"""The hyper-connection of a few CPU rows without a gradient, evaluated on the host: decoding on a CPU
(docs/ddl_mhc.md, 'Choosing a path').

A decoded token makes each sublayer's maps a handful of numbers per sequence: n read weights, the chart
logits, the n x n H_res and n write amplitudes. The node path computes them as some seventy tensor ops of one
row each, so torch's per-op overhead is most of the sublayer's cost. Here the (..., n, d) tensors take five
products (the maps projection, the read, H_res X, (H_res X) k and the rank-1 write) and everything per token
in between is Python floats (float64), as the chart's own host path (`charts/host.py`) does:

    r = 1 / sqrt(mean(vec(X)^2) + eps),  t = b + g r (vec(X) W^T)  per map            (the map logits)
    x_in = softmax(t_pre) X                                                        (the read)
    H_res = (1 - a) I + a chart(t_res), or the lazy mix                             (the mixing)
    add:   X' = H_res X + 2 sigmoid(t_post) h^T
    delta: X' = H_res X + s k^T,  k = h / sqrt(||h||^2 + eps_d^2),  s = beta (v - (H_res X) k),
           beta = 2 sigmoid(t_beta)                                                (DDL eq. 2.5)

The functions take the `HyperConnection` module, as transformers' attention functions take theirs, and call
its projections (`maps_proj`, `delta.value_proj`) as modules, so PEFT adapters on them act. The one rule
(`dispatch.choose_path`) takes this path only for CPU tensors that need no gradient, dynamic maps and n >= 2;
its reference is the node path (tests compare them and the greedy tokens they decode).
"""

import math

import torch
from torch import nn

from geoformers.models.ddl_mhc.ops.charts import chart_rows
from geoformers.models.ddl_mhc.ops.charts.host import sigmoid
from geoformers.models.ddl_mhc.ops.precision import cast
from geoformers.models.ddl_mhc.ops.stream_read.naive import upcast

__all__ = ["host_read", "host_rows", "host_write"]

# The host path takes up to min(HOST_MAX_ROWS, HOST_POINTS // (n-1)^2) rows: its Python work grows with
# rows x the chart's (n-1)^2 logits, the node's time barely with rows. The two cross, for one delta sublayer
# at width 512, near 32 rows at n = 2, 30 at n = 3, 20 at n = 4 and 7 at n = 8 (docs/ddl_mhc.md, 'Choosing a
# path'; `python scripts/bench_decode.py --host_crossing --widths 512 --reps 5 --output_dir benchmarks`).
HOST_POINTS = 144
HOST_MAX_ROWS = 24


def host_rows(num_streams: int) -> int:
    """The most rows (tokens) the host path takes at n >= 2 streams: 24 at n = 2 and 3, 16 at n = 4, 2 at
    n = 8, none from n = 14 on."""
    return min(HOST_MAX_ROWS, HOST_POINTS // (num_streams - 1) ** 2)


def _softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    weights = [math.exp(logit - top) for logit in logits]
    total = sum(weights)
    return [weight / total for weight in weights]


def _mixing(connection: nn.Module) -> tuple[float, float, float]:
    """(identity, chart, uniform) weights of H_res = i I + c chart + u J/n: (1 - a, a, 0) with a =
    sigmoid(res_mix_logit), or the lazy mix's softmax(res_mix_logits)."""
    if connection.res_mix_logits is not None:
        return tuple(_softmax(connection.res_mix_logits.tolist()))
    mix = sigmoid(connection.res_mix_logit.tolist()[0])
    return 1.0 - mix, mix, 0.0


def host_read(connection: nn.Module, streams: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(x_in (..., d), H_res (..., n, n), t_write (..., k), t_res (..., m)) of a hyper-connection with dynamic
    maps from streams X (..., n, d); the maps at least float32, x_in in X's dtype."""
    *batch, n, d = streams.shape
    flat = streams.reshape(-1, n * d)
    projected = connection.maps_proj(flat).tolist()
    norms = torch.linalg.vector_norm(upcast(flat), dim=-1).tolist()  # one op, not vecdot's two
    pre_size, res_size, write_size = connection.map_sizes
    biases = connection.pre_bias.tolist() + connection.res_bias.tolist() + connection.write_bias.tolist()
    gates = connection.pre_gate.tolist() * pre_size + connection.res_gate.tolist() * res_size
    gates += connection.write_gate.tolist() * write_size  # tolist: no dispatcher call, unlike item
    weights, res_logits, write_logits = [], [], []
    for projection, norm in zip(projected, norms, strict=True):
        scale = 1.0 / math.sqrt(norm * norm / (n * d) + connection.eps)
        terms = zip(biases, gates, projection, strict=True)
        logits = [bias + gate * scale * term for bias, gate, term in terms]
        weights.append(_softmax(logits[:n]))
        res_logits.append(logits[n : n + res_size])
        write_logits.append(logits[n + res_size :])
    maps_dtype = torch.float64 if streams.dtype == torch.float64 else torch.float32
    identity, chart, uniform = _mixing(connection)
    h_res = []
    for entries in chart_rows(res_logits, n, connection.chart, maps_dtype):
        mixed = [chart * entry + uniform / n for entry in entries]
        for i in range(n):
            mixed[i * (n + 1)] += identity
        h_res.append(mixed)
    read = torch.tensor(weights, dtype=streams.dtype).view(-1, 1, n)
    hidden = torch.bmm(read, flat.view(-1, n, d)).view(*batch, d)
    return (
        hidden,
        torch.tensor(h_res, dtype=maps_dtype).view(*batch, n, n),
        torch.tensor(write_logits, dtype=maps_dtype).view(*batch, write_size),
        torch.tensor(res_logits, dtype=maps_dtype).view(*batch, res_size),
    )


def host_write(
    connection: nn.Module,
    streams: torch.Tensor,
    output: torch.Tensor,
    h_res: torch.Tensor,
    write_logit: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(X', beta (..., 1), k (..., d)) of the delta write, (X', None, None) of the add write, from streams X
    (..., n, d), the sublayer's output h (..., d) and the maps of `host_read`; X' in X's dtype."""
    *batch, n, d = streams.shape
    dtype = streams.dtype
    mixed = torch.bmm(cast(h_res.reshape(-1, n, n), dtype), streams.reshape(-1, n, d))
    logits = write_logit.reshape(-1, write_logit.shape[-1]).tolist()
    if connection.delta is None:
        amplitudes = [[2.0 * sigmoid(logit) for logit in row] for row in logits]
        direction = cast(output.reshape(-1, d), dtype)
    else:
        hidden = upcast(output.reshape(-1, d))
        norms = torch.linalg.vector_norm(hidden, dim=-1).tolist()
        eps = connection.delta.eps
        inverse = [[1.0 / math.sqrt(norm * norm + eps * eps)] for norm in norms]
        unit = hidden * torch.tensor(inverse, dtype=hidden.dtype)
        direction = cast(unit, dtype)
        erased = torch.bmm(mixed, direction.unsqueeze(-1)).view(-1, n).tolist()
        values = connection.delta.value_proj(output).reshape(-1, n).tolist()
        betas = [2.0 * sigmoid(row[0]) for row in logits]
        amplitudes = [
            [beta * (value - along) for value, along in zip(value_row, erased_row, strict=True)]
            for beta, value_row, erased_row in zip(betas, values, erased, strict=True)
        ]
    scales = torch.tensor(amplitudes, dtype=dtype).view(-1, n, 1)
    updated = torch.baddbmm(mixed, scales, direction.unsqueeze(-2)).view(streams.shape)
    if connection.delta is None:
        return updated, None, None
    beta = torch.tensor(betas, dtype=hidden.dtype).view(*batch, 1)
    return updated, beta, unit.view(*batch, d)

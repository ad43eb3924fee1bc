"""The hyper-connection of a few CPU rows without a gradient, evaluated on the host: decoding on a CPU
(docs/ddl_mhc.md, 'Choosing a path').

A decoded token makes each sublayer's maps a handful of numbers per sequence: n read weights, the chart
logits, the n x n H_res and n write amplitudes. The node path computes them as some seventy tensor ops of one
row each, so torch's per-op overhead is most of the sublayer's cost. Here the (..., n, d) tensors take five
products per row (the maps projection, ||vec(X)||^2, the read, the delta write's [X; h^T; W_v] h and the write
itself) and everything per token in between is Python floats (float64), as the chart's own host path
(`charts/host.py`) does:

    r = 1 / sqrt(mean(vec(X)^2) + eps),  t = b + g r (vec(X) W^T)  per map            (the map logits)
    x_in = softmax(t_pre) X                                                        (the read)
    H_res = (1 - a) I + a chart(t_res), or the lazy mix                             (the mixing)
    X' = [H_res | w] [X; h^T]                                                      (the write, one product)
    add:   w = 2 sigmoid(t_post)
    delta: w = s / sqrt(||h||^2 + eps_d^2),  s = beta (v - H_res (X h) / sqrt(||h||^2 + eps_d^2)),
           beta = 2 sigmoid(t_beta),  v = W_v h + b_v          (DDL eq. 2.5: H_res X + s k^T, s k^T = w h^T)

What a decoding step pays here is mostly code that runs cold: between two hyper-connections the model's
projections stream megabytes of weights through the core's caches, so each op and Python line after them
fetches its code and data anew (docs/ddl_mhc.md, 'Choosing a path'). So the path keeps its op count low:
one-row products are one `torch.mv` / `torch.dot` (more rows take `linalg.vecdot` and `torch.bmm`), the maps
of all rows are one tensor whose fields are slices, and H_res, t_write, t_res, beta and k, which only the
`StreamMixing` record reads, are left out with `record=False` (the decoder layer's, when no hook can see it).

The functions take the `HyperConnection` module, as transformers' attention functions take theirs. Its
projections run as `F.linear` only while calling the module would run `F.linear` alone (`_plain_linear`), and
are called as modules otherwise (a PEFT adapter, a hook, accelerate's replaced `forward`), so whatever wraps
them acts; a plain `delta.value_proj` joins the write's product ([X; h^T; W_v] h). The one rule
(`dispatch.choose_path`) takes this path only for CPU tensors that need no gradient, dynamic maps and n >= 2;
its reference is the node path (tests compare them and the greedy tokens they decode).
"""

import array
import math

import torch
import torch.nn.functional as F
from torch import nn

from geoformers.models.ddl_mhc.ops.charts import chart_rows
from geoformers.models.ddl_mhc.ops.charts.host import sigmoid
from geoformers.models.ddl_mhc.ops.host_programs import mix_program, read_program, write_program
from geoformers.models.ddl_mhc.ops.precision import cast
from geoformers.models.ddl_mhc.ops.stream_read.naive import upcast

__all__ = ["host_read", "host_rows", "host_write"]

# The host path takes up to min(HOST_MAX_ROWS, HOST_POINTS // (n-1)^2) rows: its Python work grows with
# rows x the chart's (n-1)^2 logits, the node's time barely with rows. The two cross, for one delta sublayer
# at width 512, above 32 rows at n = 2 and 3, near 21 at n = 4 and 7 at n = 8 (docs/ddl_mhc.md, 'Choosing a
# path'; `python scripts/bench_decode.py --host_crossing --widths 512 --reps 5 --output_dir benchmarks`).
HOST_POINTS = 126
HOST_MAX_ROWS = 20
_TYPECODES = {torch.float32: "f", torch.float64: "d"}  # `array` codes of the maps' dtypes


def host_rows(num_streams: int) -> int:
    """The most rows (tokens) the host path takes at n >= 2 streams: 20 at n = 2 and 3, 14 at n = 4, 2 at
    n = 8, none from n = 13 on."""
    return min(HOST_MAX_ROWS, HOST_POINTS // (num_streams - 1) ** 2)


def _softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    weights = [math.exp(logit - top) for logit in logits]
    total = sum(weights)
    return [weight / total for weight in weights]


def _constants(connection: nn.Module) -> tuple[list[float], tuple[float, ...], tuple[float, float, float]]:
    """The parameters the maps read, as Python floats: the static logits b, the gates (g_pre, g_res,
    g_write) of the dynamic terms and the (identity, chart, uniform) weights of H_res = i I + c chart + u J/n:
    (1 - a, a, 0) with a = sigmoid(res_mix_logit), or the lazy mix's softmax(res_mix_logits)."""
    biases = connection.pre_bias.tolist() + connection.res_bias.tolist() + connection.write_bias.tolist()
    gates = (
        connection.pre_gate.tolist()[0],
        connection.res_gate.tolist()[0],
        connection.write_gate.tolist()[0],
    )
    if connection.res_mix_logits is not None:  # tolist: no dispatcher call, unlike item
        return biases, gates, tuple(_softmax(connection.res_mix_logits.tolist()))
    mix = sigmoid(connection.res_mix_logit.tolist()[0])
    return biases, gates, (1.0 - mix, mix, 0.0)


def _plain_linear(module: nn.Module) -> bool:
    """Whether `module` is an `nn.Linear` that calling would run as `F.linear` alone: no subclass (a PEFT
    adapter, a quantised layer), no hook of its own and no replaced `forward` (accelerate's offloading)."""
    hooked = module._forward_hooks or module._forward_pre_hooks or "forward" in vars(module)
    return type(module) is nn.Linear and not hooked


def _projected(module: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """`module(inputs)`: `F.linear` directly for a plain `nn.Linear` (`_plain_linear`), the module call
    otherwise, so a PEFT adapter, a hook or a replaced `forward` acts."""
    if _plain_linear(module):
        return F.linear(inputs, module.weight, module.bias)
    return module(inputs)


def _packed(values: list[float], dtype: torch.dtype) -> torch.Tensor:
    """Python floats -> a flat tensor of `dtype` (float32 or float64), rounded as `torch.tensor` rounds;
    through an `array` buffer, which the tensor keeps alive, in about a third of `torch.tensor`'s time."""
    return torch.frombuffer(array.array(_TYPECODES[dtype], values), dtype=dtype)


def _lead(rows: int) -> list[int]:
    """The leading dimension of the per-row products: none for one row (decoding one sequence: `torch.mv`,
    `torch.dot` and `torch.mm`), else (rows,)."""
    return [] if rows == 1 else [rows]


def host_read(connection: nn.Module, streams: torch.Tensor, record: bool = True) -> tuple[torch.Tensor, ...]:
    """(x_in (..., d), H_res (..., n, n), t_write (..., k), t_res (..., m), rows) of a hyper-connection with
    dynamic maps from streams X (..., n, d); the maps at least float32, x_in in X's dtype. `rows` holds each
    row's H_res entries (row-major) and t_write as Python floats, for `host_write`. With `record=False` the
    three maps are None (nothing reads them but the mixing record; docs/ddl_mhc.md, 'Choosing a path')."""
    *batch, n, d = streams.shape
    flat = streams.reshape(-1, n * d)
    count = flat.shape[0]
    projections = _projected(connection.maps_proj, flat).tolist()
    full = upcast(flat)
    if count == 1:  # ||vec(X)||^2, at least float32
        vector = full.view(-1)
        squares = [torch.dot(vector, vector).item()]
    else:
        squares = torch.linalg.vecdot(full, full).tolist()
    pre_size, res_size, write_size = connection.map_sizes
    biases, gates, (identity, weight, uniform) = _constants(connection)
    maps_dtype = torch.float64 if streams.dtype == torch.float64 else torch.float32
    read, reads, writes, res_rows = read_program(n, res_size, write_size), [], [], []
    for projection, square in zip(projections, squares, strict=True):
        pre, write, res = read(projection, square, biases, gates, n * d, connection.eps)
        reads += pre
        writes.append(write)
        res_rows.append(res)
    mix, shift, mixes, rows = mix_program(n), uniform / n, [], []
    for entries, write in zip(chart_rows(res_rows, n, connection.chart, maps_dtype), writes, strict=True):
        mixed = mix(entries, identity, weight, shift)
        mixes += mixed
        rows.append((mixed, write))
    packed = reads
    if record:  # one tensor holds all the maps, field after field: each field is a slice
        packed = reads + mixes + [logit for write in writes for logit in write]
        packed += [logit for res in res_rows for logit in res]
    maps, lead = _packed(packed, maps_dtype), _lead(count)
    weights = cast(maps[: count * n].view(*lead, 1, n), streams.dtype)
    hidden = torch.matmul(weights, flat.view(*lead, n, d)).view(*batch, d)
    if not record:
        return hidden, None, None, None, rows
    ends = (count * n, count * (n + n * n), count * (n + n * n + write_size))
    return (
        hidden,
        maps[ends[0] : ends[1]].view(*batch, n, n),
        maps[ends[1] : ends[2]].view(*batch, write_size),
        maps[ends[2] :].view(*batch, res_size),
        rows,
    )


def host_write(
    connection: nn.Module, streams: torch.Tensor, output: torch.Tensor, rows: list, record: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(X', beta (..., 1), k (..., d)) of the delta write, (X', None, None) of the add write and of
    `record=False`, from streams X (..., n, d), the sublayer's output h (..., d) and the `rows` of
    `host_read`; X' in X's dtype.

    Both writes are one product per row, X' = [H_res | w] [X; h^T], with w = H_post (add) or w = s /
    sqrt(||h||^2 + eps_d^2) (delta: s k^T = w h^T). The delta write's X h, ||h||^2 and v = W_v h + b_v come
    from one more product, [X; h^T; W_v] h, when `value_proj` is a plain `nn.Linear` (else it is called as a
    module, so a PEFT adapter acts); then H_res X k = H_res (X h) / sqrt(||h||^2 + eps_d^2) in Python
    floats."""
    *batch, n, d = streams.shape
    count, delta = len(rows), connection.delta
    lead = _lead(count)
    fused = delta is not None and _plain_linear(delta.value_proj)
    parts = [streams.reshape(*lead, n, d), output.reshape(*lead, 1, d)]
    if fused:
        weight = delta.value_proj.weight
        parts.append(weight.expand(*lead, n, d) if lead else weight)
    stacked = upcast(torch.cat(parts, dim=-2))  # [X; h^T (; W_v)] per row, at least float32
    packed, write = [], write_program(n, "add" if delta is None else "delta", fused)
    if delta is None:
        for h_res, logits in rows:
            packed += write(h_res, logits)
    else:
        hidden = upcast(output)
        if count == 1:  # [X; h^T (; W_v)] h: X h, ||h||^2 (and W_v h)
            products = [torch.mv(stacked, hidden.view(d)).tolist()]
        else:
            products = torch.linalg.vecdot(stacked, hidden.view(count, 1, d)).tolist()
        if fused:  # the value's bias: its weight's rows are in the products
            bias = delta.value_proj.bias
            values = [[0.0] * n if bias is None else bias.tolist()] * count
        else:
            values = delta.value_proj(output).reshape(count, n).tolist()
        eps, betas, inverses = delta.eps, [], []
        for (h_res, logits), row, value in zip(rows, products, values, strict=True):
            matrix, beta, inverse = write(h_res, logits, row, value, eps)
            packed += matrix
            betas.append(beta)
            inverses.append(inverse)
        packed += betas
        packed += inverses
    maps, width = _packed(packed, stacked.dtype), (2 * n + 1 if fused else n + 1)  # [H_res | w (| 0)]
    mixes = maps[: count * n * width].view(*lead, n, width)
    updated = cast(torch.matmul(mixes, stacked).view(streams.shape), streams.dtype)
    if delta is None or not record:
        return updated, None, None
    tail = count * n * width
    beta = maps[tail : tail + count].view(*batch, 1)
    if count == 1:  # k = h / sqrt(||h||^2 + eps_d^2), the scale as a Python float
        return updated, beta, hidden * inverses[0]
    return updated, beta, hidden * maps[tail + count :].view(*batch, 1)

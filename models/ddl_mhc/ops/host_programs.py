"""The host path's per-row float math as straight-line Python, one program per shape (docs/ddl_mhc.md,
'Choosing a path').

A decoded token's sublayer runs its maps in Python floats (`host_connection.py`), right after the model's
projections have streamed megabytes of weights through the core's caches, so every loop, comprehension and
helper call fetches its code anew. As the chart's host path does (`charts/host.py`, `_row_program`), the
formulas are written out once per (n, map sizes) and compiled, as `torch.fx` emits Python for a graph: locals
and float arithmetic only, the same operations in the same order as the loops they replace.

    read:  s = 1 / sqrt(||vec(X)||^2 / (n d) + eps),  t = b + (g s) p  per map (p = vec(X) W^T)
           H_pre = softmax(t_pre),  H_res = i I + c chart(t_res) + u J/n
    write: add    [H_res | 2 sigmoid(t_post)]
           delta  [H_res | w | 0],  w_i = beta r (v_i - r (H_res X h)_i),  r = 1 / sqrt(||h||^2 + eps_d^2),
                  beta = 2 sigmoid(t_beta)   (DDL eq. 2.5 as X' = [H_res | w] [X; h^T])
"""

import functools
import math
from collections.abc import Callable

from geoformers.models.ddl_mhc.ops.charts.host import sigmoid

__all__ = ["mix_program", "read_program", "write_program"]


def _compiled(lines: list[str], name: str, label: str) -> Callable:
    namespace = {"exp": math.exp, "sqrt": math.sqrt, "sigmoid": sigmoid}
    exec(compile("\n".join(lines), f"<{label}>", "exec"), namespace)  # noqa: S102
    return namespace[name]


@functools.cache
def read_program(n: int, res_size: int, write_size: int) -> Callable:
    """`read(p, square, b, gates, width, eps)` -> (H_pre, t_write, t_res) of one row, lists of Python floats:
    p the row's maps projection (n + res_size + write_size values), square its ||vec(X)||^2, b the static
    logits, gates (g_pre, g_res, g_write) and width n d."""
    pre = range(n)
    res = range(n, n + res_size)
    write = range(n + res_size, n + res_size + write_size)
    lines = [
        "def read(p, square, b, gates, width, eps):",
        "    scale = 1.0 / sqrt(square / width + eps)",
        "    g_pre, g_res, g_write = gates[0] * scale, gates[1] * scale, gates[2] * scale",
        *(f"    t{k} = b[{k}] + g_pre * p[{k}]" for k in pre),
        f"    top = max({', '.join(f't{k}' for k in pre)})",
        *(f"    e{k} = exp(t{k} - top)" for k in pre),
        f"    total = {' + '.join(f'e{k}' for k in pre)}",
        f"    return [{', '.join(f'e{k} / total' for k in pre)}], "
        f"[{', '.join(f'b[{k}] + g_write * p[{k}]' for k in write)}], "
        f"[{', '.join(f'b[{k}] + g_res * p[{k}]' for k in res)}]",
    ]
    return _compiled(lines, "read", f"host read, n = {n}")


@functools.cache
def mix_program(n: int) -> Callable:
    """`mix(x, identity, weight, shift)` -> H_res = identity I + weight chart + shift J, row-major, from the
    chart's entries x of one row (Python floats)."""
    entries = [f"weight * x[{j}] + shift" + (" + identity" if j % (n + 1) == 0 else "") for j in range(n * n)]
    lines = ["def mix(x, identity, weight, shift):", f"    return [{', '.join(entries)}]"]
    return _compiled(lines, "mix", f"host mix, n = {n}")


@functools.cache
def write_program(n: int, residual: str, fused: bool) -> Callable:
    """The write's matrix of one row as a row-major list of Python floats:

    - "add": `write(h, t)` -> [H_res | H_post] (n x (n + 1)) from H_res's entries h and t_post;
    - "delta": `write(h, t, row, v, eps)` -> ([H_res | w | 0], beta, r) (n x (2n + 1) with `fused`, the
      product that also takes W_v's rows, else n x (n + 1)) from t = [t_beta], row = [X h, ||h||^2 (, W_v h)]
      and v the value's bias (`fused`) or the value itself."""
    if residual == "add":
        lines = ["def write(h, t):"]
        terms = [
            term
            for i in range(n)
            for term in (*(f"h[{i * n + j}]" for j in range(n)), f"2.0 * sigmoid(t[{i}])")
        ]
        return _compiled([*lines, f"    return [{', '.join(terms)}]"], "write", f"host add write, n = {n}")
    lines = [
        "def write(h, t, row, v, eps):",
        f"    inverse = 1.0 / sqrt(row[{n}] + eps * eps)",
        "    beta = 2.0 * sigmoid(t[0])",
        "    scale = beta * inverse",
    ]
    terms = []
    for i in range(n):
        erased = " + ".join(f"h[{i * n + j}] * row[{j}]" for j in range(n))
        value = f"row[{n + 1 + i}] + v[{i}]" if fused else f"v[{i}]"
        terms += [f"h[{i * n + j}]" for j in range(n)]
        terms.append(f"scale * ({value} - inverse * ({erased}))")
        terms += ["0.0"] * (n if fused else 0)
    lines.append(f"    return [{', '.join(terms)}], beta, inverse")
    return _compiled(lines, "write", f"host delta write, n = {n}")

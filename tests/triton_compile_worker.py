"""Compile every Triton kernel of geoformers for an sm_90 GPU target, without a GPU, through ptxas to a
cubin (the interpreter does not lower kernels, so this catches what only a GPU build would reject).

Run in a fresh process with TRITON_INTERPRET unset (it must be unset when the kernels are defined);
prints one line per kernel with its registers and stack bytes and exits non-zero on the first failure.
Used by tests/test_triton_kernels.py::test_kernels_compile_for_a_gpu.
"""

import os
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from geoformers.models.ddl_mhc.chart_specs import TRANSPORT_CHARTS
from geoformers.models.ddl_mhc.ops.charts import naive
from geoformers.models.ddl_mhc.ops.charts import triton as chart_kernels
from geoformers.models.ddl_mhc.ops.stream_read import triton as read_kernels
from geoformers.models.ddl_mhc.ops.stream_write import triton as write_kernels

TARGET = GPUTarget("cuda", 90, 32)
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
POINTERS = {"points_ptr": "*fp64", "table_ptr": "*fp64", "index_ptr": "*i32", "choice_ptr": "*fp64"}
STREAM_POINTERS = ("x_ptr", "out_ptr", "g_ptr", "grad_x_ptr")


def compile_kernel(kernel, options: dict, streams: str = "*fp32") -> None:
    """Compile `kernel` with the launch options of the wrappers (constexprs and num_warps)."""
    options = dict(options)
    num_warps = options.pop("num_warps", 4)
    signature = {}
    for param in kernel.params:
        name = param.name
        if param.is_constexpr:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = streams if name in STREAM_POINTERS else POINTERS.get(name, "*fp32")
        else:
            signature[name] = "i32"
    compiled = triton.compile(
        ASTSource(fn=kernel, signature=signature, constexprs=options),
        target=TARGET,
        options={"num_warps": num_warps},
    )
    usage = ""
    if os.path.exists(CUOBJDUMP):
        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            cubin.write(compiled.asm["cubin"])
            cubin.flush()
            dump = subprocess.run(
                [CUOBJDUMP, "--dump-resource-usage", cubin.name], capture_output=True, text=True
            )
            usage = " ".join(word for word in dump.stdout.split() if word.startswith(("REG:", "STACK:")))
    print(kernel.__name__, options, streams, usage, flush=True)


def main(streams_counts: list[int]) -> None:
    for n in streams_counts:
        for base in TRANSPORT_CHARTS:
            for choice in (naive.PLAIN, naive.SCALED):  # the kernels' two interval-choice variants
                _, launch = chart_kernels._launch(torch.zeros(4096, (n - 1) ** 2), n, base, choice)
                compile_kernel(chart_kernels._chart_forward_kernel, launch["meta"])
                compile_kernel(chart_kernels._chart_backward_kernel, launch["meta"])
        for dtype in ("*fp32", "*bf16"):
            for d in (768, 100):
                read = read_kernels.launch_options(n, d, None, square=False)
                write = read_kernels.launch_options(n, d, None, square=True)
                compile_kernel(read_kernels._read_forward_kernel, read, dtype)
                compile_kernel(read_kernels._read_backward_kernel, read, dtype)
                compile_kernel(write_kernels._write_forward_kernel, write, dtype)
                compile_kernel(write_kernels._write_backward_kernel, write, dtype)
                delta = {**write, "ONE_BLOCK": write["BD"] >= d}
                compile_kernel(write_kernels._delta_forward_kernel, delta, dtype)
                compile_kernel(write_kernels._delta_backward_kernel, write, dtype)


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET", "0") != "0":
        sys.exit("run with TRITON_INTERPRET unset or 0: interpreted kernels cannot be compiled")
    main([int(n) for n in sys.argv[1:]] or [2, 4])

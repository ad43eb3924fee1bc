"""The stream read x_in = H_pre X and, with dynamic maps, the map terms it comes from (docs/ddl_mhc.md,
'Hyper-connections' and 'Fused sublayer'): `naive.py` is the plain PyTorch reference, `node.py` the autograd
nodes with hand-written backward passes, `triton.py` the kernel. The model calls `read_streams`, whose path
(kernel, node or reference) is chosen by the one rule of `geoformers.models.ddl_mhc.ops.dispatch`.
"""

import torch

from geoformers.models.ddl_mhc.ops.dispatch import STREAM_DTYPES, choose_path, kernel, run_node
from geoformers.models.ddl_mhc.ops.stream_read.naive import naive_read_streams, naive_stream_maps, upcast
from geoformers.models.ddl_mhc.ops.stream_read.node import StreamMapsRead, StreamRead

__all__ = ["read_streams"]

TRITON = "geoformers.models.ddl_mhc.ops.stream_read.triton"


def read_streams(
    streams: torch.Tensor,
    pre_bias: torch.Tensor,
    pre_gate: torch.Tensor | None = None,
    projected: torch.Tensor | None = None,
    eps: float = 0.0,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(z, x_in) from streams X (..., n, d) and the read logits b_pre (n,):

    - static maps (`projected` None): z is None and x_in = softmax(b_pre) X;
    - dynamic maps: `projected` = vec(X) W^T (..., m) is the maps projection's output, already computed by
      the caller (a plain `nn.Linear` or a PEFT wrapper of one, so adapters act and get gradients), and
      z = projected / sqrt(mean(vec(X)^2) + eps) (..., m), at least float32, x_in = softmax(b_pre + g_pre
      z[..., :n]) X, with the gate g_pre (1,).

    x_in (..., d) is in X's dtype. Node: `StreamMapsRead` / `StreamRead`; kernel: the read, after the map
    terms are formed in PyTorch."""
    if projected is not None and pre_gate is None:
        raise TypeError("read_streams: dynamic maps (`projected` given) need `pre_gate`")
    path = choose_path(streams, pre_bias, projected, kernel_dtypes=STREAM_DTYPES)
    read_kernel = kernel(TRITON, "triton_read_streams") if path == "triton" else None
    if projected is None:
        weights = torch.softmax(upcast(pre_bias), -1)
        if path == "naive":
            return None, naive_read_streams(weights, streams)
        if read_kernel is not None:
            return None, read_kernel(weights, streams)
        return None, run_node(StreamRead, weights.expand(*streams.shape[:-2], -1), streams)
    if path == "naive" or read_kernel is not None:
        terms, weights = naive_stream_maps(streams, projected, pre_bias, pre_gate, eps)
        read = naive_read_streams if read_kernel is None else read_kernel
        return terms, read(weights, streams)
    return run_node(StreamMapsRead, streams, projected, pre_bias, pre_gate, eps)

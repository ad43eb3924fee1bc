"""The models' ops, one folder each (docs/ddl_mhc.md, 'One home per op'): a plain PyTorch reference
(`naive.py`), the autograd nodes and the Triton kernels side by side, and one dispatcher the model calls.
`dispatch.py` decides when the Triton kernels run."""

"""The models' ops, one folder each (docs/ddl_mhc.md, 'One home per op'): a plain PyTorch reference
(`naive.py`), the autograd nodes and the Triton kernels side by side, and one function the model calls.
`dispatch.py` holds the one rule that picks the kernel or the node from the tensors ('Choosing a path')."""

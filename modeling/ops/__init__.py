"""The models' ops, one folder per op: a naive PyTorch reference, the autograd node and the Triton kernel
side by side, and one dispatcher that the model calls (docs/ddl_mhc.md, 'Fused sublayer')."""

"""DDL-mHC (docs/ddl_mhc.md): its configuration, modeling, ops (`ops/`: charts, stream read and write, each
with its PyTorch reference, autograd node and Triton kernel) and the Llama converter."""

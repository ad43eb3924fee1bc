#!/usr/bin/env bash
# The GPU benchmark, one short run on a CUDA machine (bf16 autocast, Triton kernels on CUDA tensors):
# Llama vs DDL-mHC n=4 delta (fused = Triton) vs the same model in plain PyTorch vs the peer mHC, at width 768
# with 12 layers (GPT-2 small's shape), then the charts. Writes benchmarks/causal_lm_sweep_cuda.json,
# causal_lm_sweep_compiled_cuda.json and outputs/benchmarks_cuda/birkhoff.json (commit it as
# benchmarks/birkhoff_cuda.json). First, a DDL-mHC training step must make no host sync on the GPU
# (tests/test_host_syncs.py under torch.cuda.set_sync_debug_mode("error"); -rs shows a skip without CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
"$PYTHON" -m pytest -q -rs -p no:cacheprovider tests/test_host_syncs.py::test_cuda_step_makes_no_sync
"$PYTHON" scripts/bench_causal_lm.py --bf16 --sweep --widths 768 --layers 12 \
    --per_device_train_batch_size 16 --block_size 256 --max_steps 60 --warmup_steps 10 --eval_batches 5 --gen_tokens 100 --gen_reps 3 \
    --output_dir benchmarks
"$PYTHON" scripts/bench_causal_lm.py --bf16 --sweep --torch_compile --widths 768 --layers 12 --no_peer \
    --per_device_train_batch_size 16 --block_size 256 --max_steps 60 --warmup_steps 10 --eval_batches 5 --gen_tokens 100 --gen_reps 3 \
    --output_dir benchmarks
"$PYTHON" scripts/bench_birkhoff.py --device cuda --sizes 4 8 16 32 --batch 65536 \
    --output_dir outputs/benchmarks_cuda

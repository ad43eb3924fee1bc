"""The causal-LM scripts' shared pieces (bench_causal_lm.py, exp_stream_scaling.py, upcycle_llama.py,
finetune_lora.py, exp_upcycle_pretrained.py): tiny-shakespeare as character ids, validation on fixed random
windows, the settings that define a run (`recipe_settings`), its `Trainer` (`build_trainer`; round robin
through `harness.round_robin`), and the benchmark's models (docs/experiments.md, 'Shared causal-LM recipe').
"""

import argparse
import copy
import dataclasses
import functools
import statistics

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import geoformers
from geoformers.models.ddl_mhc.ops.dispatch import ops_path
from geoformers.tokenization import build_char_tokenizer
from geoformers.training.data import load_tiny_shakespeare

from harness.data_errors import DATA_FLAG, exit_without_data
from harness.flags import training_arguments
from harness.lm_trainer import build_lm_trainer
from harness.random_windows import RandomWindows, get_batch
from harness.round_robin import RoundRobin

# nanoGPT's small CPU config (4 layers, 4 heads, width 128, block 64); SwiGLU width 344 (Llama's 2.69x).
SMALL_CPU_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 344,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
}
LLAMA = "llama (transformers)"
PEER = "peer mHC n=4 (hyper-connections)"
VARIANTS = {
    LLAMA: None,
    "ddl-mhc n=1 add": {"hc_streams": 1, "residual": "add"},
    "ddl-mhc n=1 delta": {"hc_streams": 1, "residual": "delta"},
    "ddl-mhc n=4 add sinkhorn": {"hc_streams": 4, "residual": "add", "hc_chart": "sinkhorn"},
    "ddl-mhc n=4 add rtbp": {"hc_streams": 4, "residual": "add", "hc_chart": "rtbp"},
    "ddl-mhc n=4 delta rtbp": {"hc_streams": 4, "residual": "delta", "hc_chart": "rtbp"},
    "ddl-mhc n=4 delta rtbp reference": {
        "hc_streams": 4,
        "residual": "delta",
        "hc_chart": "rtbp",
        "ops_path": "naive",  # not a config field: the model runs inside `ops_path("naive")`
    },
}
SWEEP_VARIANTS = (LLAMA, "ddl-mhc n=1 delta", "ddl-mhc n=4 delta rtbp", PEER)
# On CUDA the fused path runs the Triton kernels; the reference row is the same model in plain PyTorch.
GPU_SWEEP_VARIANTS = (LLAMA, "ddl-mhc n=4 delta rtbp", "ddl-mhc n=4 delta rtbp reference", PEER)
EQUAL_TIME_VARIANTS = (LLAMA, "llama param-matched", "ddl-mhc n=1 delta", "ddl-mhc n=4 delta rtbp")


def load_corpus(path: str | None = None, train_fraction: float = 0.9):
    """(tokenizer, train ids, validation ids): char tokenizer over the whole text, nanoGPT split (first
    `train_fraction` train). `path`: a local UTF-8 text file; None: the hub's tiny-shakespeare."""
    with exit_without_data(DATA_FLAG):
        text = load_tiny_shakespeare(path)
    tokenizer = build_char_tokenizer(text)
    ids = torch.tensor(tokenizer.encode(text, add_special_tokens=False, verbose=False), dtype=torch.long)
    split = int(train_fraction * len(ids))
    return tokenizer, ids[:split], ids[split:]


def split_ids(ids: torch.Tensor, train_fraction: float, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """nanoGPT split (first `train_fraction` train); both parts need more than `block_size` tokens for one
    window."""
    split = int(train_fraction * len(ids))
    train_ids, val_ids = ids[:split], ids[split:]
    for name, part in (("train", train_ids), ("validation", val_ids)):
        if len(part) <= block_size:
            raise ValueError(
                f"the {name} split of --data has {len(part)} tokens; it needs more than "
                f"--block_size={block_size} (use a longer text or a smaller --block_size)"
            )
    return train_ids, val_ids


@torch.no_grad()
def estimate_loss(model, ids, batch_size, block_size, num_batches, seed, device) -> float:
    """Mean loss over `num_batches` fixed random windows (same windows for every model and call)."""
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(num_batches):
        batch = get_batch(ids, batch_size, block_size, generator).to(device)
        losses.append(model(input_ids=batch, labels=batch).loss.item())
    model.train(was_training)
    return sum(losses) / len(losses)


# The flags that define a run of the comparisons (a report's `settings`; a grid resumes only under the same):
# nanoGPT's recipe under `TrainingArguments`' names, the windows, the chart multiplier and the thread count.
RECIPE_FLAGS = (
    "max_steps",
    "per_device_train_batch_size",
    "block_size",
    "learning_rate",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "warmup_steps",
    "weight_decay",
    "adam_beta2",
    "max_grad_norm",
    "optim",
    "chart_lr_multiplier",
    "eval_batches",
    "seed",
    "threads",
    "torch_compile",
    "bf16",
)
# Reports written when the scripts had their own flags (`min_lr_ratio`, `device`) lack the recipe's fixed
# part, whose values were then: the cosine to a floor, torch's AdamW, one learning rate for the chart logits.
LEGACY_RECIPE = {
    "lr_scheduler_type": "cosine_with_min_lr",
    "optim": "adamw_torch",
    "chart_lr_multiplier": 1.0,
}


def recipe_settings(args: argparse.Namespace) -> dict:
    """The `RECIPE_FLAGS` of a namespace of `harness.lm_trainer.lm_parser`, and the device the Trainer
    chooses (`--use_cpu` or the accelerator)."""
    training_args = training_arguments(args)
    settings = {name: getattr(args, name) for name in RECIPE_FLAGS}
    settings["lr_scheduler_kwargs"] = dict(training_args.lr_scheduler_kwargs)  # a flag's JSON, parsed
    settings["optim"] = str(training_args.optim.value)
    settings["lr_scheduler_type"] = str(training_args.lr_scheduler_type.value)
    settings["device"] = training_args.device.type
    return settings


def run_settings(args: argparse.Namespace, *own, leave_out: tuple[str, ...] = ()) -> dict:
    """A report's `settings`: `recipe_settings` and the fields of the script's dataclasses `own`, but for
    `leave_out`."""
    settings = recipe_settings(args)
    settings.update(
        {f.name: getattr(args, f.name) for dataclass in own for f in dataclasses.fields(dataclass)}
    )
    return {key: value for key, value in settings.items() if key not in leave_out}


def in_current_names(saved: dict) -> dict:
    """A report's `settings` under today's flag names: a report of the scripts' former flags has
    `min_lr_ratio` (now `lr_scheduler_kwargs`' `min_lr_rate`) and lacks `LEGACY_RECIPE`'s settings."""
    if "min_lr_ratio" not in saved:
        return dict(saved)
    current = {**LEGACY_RECIPE, **saved}
    current["lr_scheduler_kwargs"] = {"min_lr_rate": current.pop("min_lr_ratio")}
    return current


def build_trainer(model, train_ids, args, skip_batches: int = 0):
    """The scripts' `Trainer` (`harness.lm_trainer.build_lm_trainer`) for `model` on nanoGPT's random windows
    of `train_ids` from `args.seed` (after `skip_batches`), with the `TrainingArguments` of the namespace
    `args` (`harness.lm_trainer.lm_parser`): so every model of a comparison sees the same batches."""
    batch = args.per_device_train_batch_size
    windows = RandomWindows(train_ids, batch, args.block_size, args.seed, skip_batches=skip_batches)
    arguments = training_arguments(args)
    return build_lm_trainer(model, arguments, windows, chart_lr_multiplier=args.chart_lr_multiplier)


def train_trainers_round_robin(trainers: dict) -> dict:
    """`harness.round_robin.RoundRobin` over `trainers` (each runs its own `max_steps`): each one's step
    seconds and logged losses."""
    seconds = RoundRobin(trainers).train()
    losses = {
        name: [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        for name, trainer in trainers.items()
    }
    return {"seconds": seconds, "losses": losses}


def interleaved_step_seconds(models: dict, train_ids, args, steps: int) -> dict:
    """Median step seconds of fresh copies of `models` trained round robin through their `Trainer`s for
    `steps` steps of `args`'s recipe (the first two, warm-up of the allocator and caches, left out)."""
    timing_args = copy.copy(args)
    timing_args.max_steps = steps
    trainers = {
        name: build_trainer(copy.deepcopy(model), train_ids, timing_args) for name, model in models.items()
    }
    run = train_trainers_round_robin(trainers)
    return {name: statistics.median(seconds[2:]) for name, seconds in run["seconds"].items()}


def shape_for(width: int, layers: int) -> dict:
    """SMALL_CPU_SHAPE's proportions (SwiGLU width 2.6875 x hidden, 4 heads) at another width / depth."""
    return dict(
        SMALL_CPU_SHAPE, hidden_size=width, intermediate_size=int(2.6875 * width), num_hidden_layers=layers
    )


def build_model(name: str, tokenizer, max_positions: int, shape: dict, intermediate_size: int | None = None):
    fields = dict(
        shape,
        vocab_size=len(tokenizer),
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if intermediate_size is not None:
        fields["intermediate_size"] = intermediate_size
    if name == PEER:
        from harness.peer_mhc import build_peer_mhc_llama  # needs the optional `hyper-connections`

        return build_peer_mhc_llama(LlamaConfig(**fields), num_streams=4)
    if VARIANTS.get(name) is None:
        return LlamaForCausalLM(LlamaConfig(**fields))
    variant = dict(VARIANTS[name])
    path = variant.pop("ops_path", None)
    model = geoformers.DDLmHCForCausalLM(geoformers.DDLmHCConfig(**fields, **variant))
    return model if path is None else on_ops_path(model, path)


def on_ops_path(model: torch.nn.Module, path: str) -> torch.nn.Module:
    """`model` with every forward run inside `ops_path(path)` (docs/ddl_mhc.md, 'Choosing a path'): the
    benchmarks' reference rows ("naive") are the same model in plain PyTorch. The backward needs no path: it
    follows the graph the forward built."""
    forward = model.forward

    @functools.wraps(forward)
    def forward_on_path(*args, **kwargs):
        with ops_path(path):
            return forward(*args, **kwargs)

    model.forward = forward_on_path
    return model


def training_memory_bytes(model, batch: torch.Tensor, device: torch.device) -> int:
    """Peak training memory of one step (see the module docstring)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        model(input_ids=batch, labels=batch).loss.backward()
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(device)
    saved = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    parameter_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    activations = sum(nbytes for ptr, nbytes in saved.items() if ptr not in parameter_ptrs)
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    return 4 * parameters + activations

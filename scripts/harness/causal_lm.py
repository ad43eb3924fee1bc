"""The causal-LM scripts' shared pieces (bench_causal_lm.py, exp_stream_scaling.py, upcycle_llama.py,
finetune_lora.py, exp_upcycle_pretrained.py): tiny-shakespeare as character ids, validation on fixed random
windows, nanoGPT's flags (`NanoGPTArguments`) and their `Trainer` (`build_trainer`; round robin through
`harness.round_robin`), and the benchmark's models (docs/experiments.md, 'Shared causal-LM recipe').
"""

import argparse
import copy
import functools
import statistics
from dataclasses import dataclass, field

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    TrainingArguments,
)

import geoformers
from geoformers.modeling.ops.dispatch import ops_path
from geoformers.tokenization import build_char_tokenizer
from geoformers.training.data import load_tiny_shakespeare

from harness.data_errors import DATA_FLAG, exit_without_data
from harness.flag_checks import CheckedParser
from harness.lm_trainer import SCRIPT_TRAINING_DEFAULTS, build_lm_trainer
from harness.random_windows import RandomWindows, get_batch
from harness.round_robin import RoundRobin
from harness.threads import DEFAULT_THREADS, THREADS_HELP

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


def training_arguments(args, device: torch.device) -> TrainingArguments:
    """The `TrainingArguments` of `NanoGPTArguments` flags: the recipe through the `Trainer`
    (`harness.lm_trainer`; foreach AdamW as the committed runs' loop, `cosine_with_min_lr`), logging every
    step, saving and reporting nothing."""
    flags = {
        "output_dir": args.output_dir,
        "max_steps": args.max_steps,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "learning_rate": args.learning_rate,
        "weight_decay": args.weight_decay,
        "adam_beta2": args.adam_beta2,
        "max_grad_norm": args.max_grad_norm,
        "warmup_steps": args.warmup_steps,
        "lr_scheduler_kwargs": {"min_lr_rate": args.min_lr_ratio},
        "seed": args.seed,
        "report_to": [],
        "torch_compile": args.torch_compile,
        "bf16": getattr(args, "bf16", False),
        "use_cpu": device.type == "cpu",
    }
    return TrainingArguments(
        **{**SCRIPT_TRAINING_DEFAULTS, **flags}
    )  # the recipe's fixed part, then the flags


def build_trainer(model, train_ids, args, device, chart_lr_multiplier: float = 1.0, skip_batches: int = 0):
    """The scripts' `Trainer` (`harness.lm_trainer.build_lm_trainer`) for `model` on nanoGPT's random windows
    of `train_ids` from `args.seed` (after `skip_batches`), with the loop's flags: so every model of a
    comparison sees the same batches. `chart_lr_multiplier=1`: the grouping of the loop that produced the
    committed numbers."""
    batch = args.per_device_train_batch_size
    windows = RandomWindows(train_ids, batch, args.block_size, args.seed, skip_batches=skip_batches)
    arguments = training_arguments(args, device)
    return build_lm_trainer(model, arguments, windows, chart_lr_multiplier=chart_lr_multiplier)


def train_trainers_round_robin(trainers: dict) -> dict:
    """`harness.round_robin.RoundRobin` over `trainers` (each runs its own `max_steps`): each one's step
    seconds and logged losses."""
    seconds = RoundRobin(trainers).train()
    losses = {
        name: [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        for name, trainer in trainers.items()
    }
    return {"seconds": seconds, "losses": losses}


def interleaved_step_seconds(models: dict, train_ids, args, device, steps: int) -> dict:
    """Median step seconds of fresh copies of `models` trained round robin through their `Trainer`s for
    `steps` steps of `args`'s recipe (the first two, warm-up of the allocator and caches, left out)."""
    timing_args = copy.copy(args)
    timing_args.max_steps = steps
    trainers = {
        name: build_trainer(copy.deepcopy(model), train_ids, timing_args, device)
        for name, model in models.items()
    }
    run = train_trainers_round_robin(trainers)
    return {name: statistics.median(seconds[2:]) for name, seconds in run["seconds"].items()}


@dataclass
class NanoGPTArguments:
    """nanoGPT's recipe as flags, each setting `TrainingArguments` has under that class's name, turned into
    the `TrainingArguments` of the scripts' `Trainer`s by `training_arguments` (docs/experiments.md,
    'Flags'). The comparisons keep these flags rather than all of `TrainingArguments` so that their
    committed reports' settings (and the resumption of a committed grid) stay as they were."""

    _argument_group_name = "nanoGPT's recipe (TrainingArguments' names where it has the setting)"

    data: str | None = field(
        default=None, metadata={"help": "local UTF-8 text file; default: the hub's karpathy/tiny_shakespeare"}
    )
    output_dir: str | None = field(default=None, metadata={"help": "where the results go"})
    max_steps: int = SCRIPT_TRAINING_DEFAULTS["max_steps"]
    per_device_train_batch_size: int = field(
        default=SCRIPT_TRAINING_DEFAULTS["per_device_train_batch_size"], metadata={"help": "windows per step"}
    )
    block_size: int = field(default=64, metadata={"help": "tokens per window"})
    learning_rate: float = SCRIPT_TRAINING_DEFAULTS["learning_rate"]
    min_lr_ratio: float = field(
        default=SCRIPT_TRAINING_DEFAULTS["lr_scheduler_kwargs"]["min_lr_rate"],
        metadata={"help": "the cosine decays to this x learning_rate"},
    )
    warmup_steps: int = field(
        default=SCRIPT_TRAINING_DEFAULTS["warmup_steps"], metadata={"help": "linear warm-up steps"}
    )
    weight_decay: float = field(
        default=SCRIPT_TRAINING_DEFAULTS["weight_decay"], metadata={"help": "AdamW's, on matrices only"}
    )
    adam_beta2: float = SCRIPT_TRAINING_DEFAULTS["adam_beta2"]
    max_grad_norm: float = field(
        default=SCRIPT_TRAINING_DEFAULTS["max_grad_norm"], metadata={"help": "gradient clipping"}
    )
    eval_batches: int = field(default=20, metadata={"help": "validation batches per loss estimate"})
    seed: int = SCRIPT_TRAINING_DEFAULTS["seed"]
    device: str = field(default_factory=lambda: "cuda" if torch.cuda.is_available() else "cpu")
    threads: int = field(default=DEFAULT_THREADS, metadata={"help": THREADS_HELP})
    torch_compile: bool = field(default=False, metadata={"help": "train through torch.compile (inductor)"})
    bf16: bool = field(default=False, metadata={"help": "bfloat16 autocast (GPU runs)"})


def nanogpt_parser(*own, description: str | None = None, **defaults) -> CheckedParser:
    """`CheckedParser` over a script's dataclasses `own` and `NanoGPTArguments`, with the script's defaults
    (`RawDescriptionHelpFormatter`: the script's docstring as written)."""
    parser = CheckedParser(
        (*own, NanoGPTArguments),
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(**defaults)
    return parser


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

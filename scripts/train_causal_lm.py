"""Train a DDL-mHC causal LM (docs/ddl_mhc.md) on a text file, character level, nanoGPT style.

The text is split like nanoGPT's shakespeare_char (first 90 % train, last 10 % validation) and tokenised
by `geoformers.tokenization.build_char_tokenizer`. Training: random (batch, block) windows, AdamW with
linear warm-up and cosine decay to `--min-lr-ratio` x lr, gradient clipping, a validation loss every
`--eval-interval` steps, a sampled continuation at the end. The model and tokenizer are saved with
`save_pretrained`, so `AutoModelForCausalLM.from_pretrained(out)` / `AutoTokenizer.from_pretrained(out)`
load them after `import geoformers`.

Every `DDLmHCConfig` field is a flag of its own (`--hc_streams 4 --residual delta --hc_chart rtbp ...`);
`vocab_size` and the special token ids come from the tokenizer.

    python scripts/train_causal_lm.py                                  # nanoGPT's small CPU config
    python scripts/train_causal_lm.py --steps 200 --hc_streams 1 --residual add --output_dir outputs/llama
"""

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import get_cosine_with_min_lr_schedule_with_warmup

import geoformers
from geoformers.configuration.ddl_mhc import DDLmHCConfig
from geoformers.tokenization import build_char_tokenizer

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
# nanoGPT's small CPU config (4 layers, 4 heads, width 128, block 64); SwiGLU width 344 (Llama's 2.69x).
SMALL_CPU_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 344,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
}
TOKENIZER_FIELDS = ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id")


# ----------------------------------------------------------------------------------------------
# Data


def load_corpus(path: str | Path, train_fraction: float = 0.9):
    """(tokenizer, train ids, validation ids): char tokenizer over the whole file, nanoGPT split."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--data {path} does not exist")
    text = path.read_text(encoding="utf-8")
    tokenizer = build_char_tokenizer(text)
    ids = torch.tensor(tokenizer.encode(text, add_special_tokens=False, verbose=False), dtype=torch.long)
    split = int(train_fraction * len(ids))
    return tokenizer, ids[:split], ids[split:]


def get_batch(ids: torch.Tensor, batch_size: int, block_size: int, generator: torch.Generator):
    """`batch_size` random windows of `block_size` tokens (the labels are the same tensor: HF shifts them)."""
    if len(ids) <= block_size:
        raise ValueError(f"the split has {len(ids)} tokens, fewer than block_size + 1 = {block_size + 1}")
    starts = torch.randint(len(ids) - block_size, (batch_size,), generator=generator)
    return torch.stack([ids[s : s + block_size] for s in starts.tolist()])


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


# ----------------------------------------------------------------------------------------------
# Optimisation


def make_optimizer(model, lr, weight_decay, beta2, warmup_steps, steps, min_lr_ratio):
    """AdamW (decay on matrices only, nanoGPT) with linear warm-up and cosine decay to min_lr_ratio * lr."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=(0.9, beta2))
    schedule = get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, num_warmup_steps=warmup_steps, num_training_steps=steps, min_lr_rate=min_lr_ratio
    )
    return optimizer, schedule


def make_trainer(model, train_ids, args, device):
    """A `step()` closure: one optimisation step on the next batch, returning (loss, wall seconds). The
    batches come from a generator seeded with `args.seed`, so every model sees the same batches. With
    `args.compile` the forward runs through `torch.compile` (the first step pays the compilation); with
    `args.bf16` under bfloat16 autocast. The closure carries its `optimizer`, `schedule` and batch `generator`
    as attributes, so a run can branch from it (`upcycle_llama.py`)."""
    optimizer, schedule = make_optimizer(
        model, args.lr, args.weight_decay, args.beta2, args.warmup_steps, args.steps, args.min_lr_ratio
    )
    generator = torch.Generator().manual_seed(args.seed)
    model.train()
    forward = torch.compile(model) if args.compile else model
    bf16 = getattr(args, "bf16", False)

    def step() -> tuple[float, float]:
        batch = get_batch(train_ids, args.batch_size, args.block_size, generator).to(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = forward(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"training loss became {loss.item()}")
        return loss.item(), seconds

    step.optimizer, step.schedule, step.generator = optimizer, schedule, generator
    return step


def add_training_arguments(parser: argparse.ArgumentParser, steps: int) -> None:
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="UTF-8 text file")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--batch_size", type=int, default=12)
    parser.add_argument("--block_size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--min_lr_ratio", type=float, default=0.1)
    parser.add_argument("--warmup_steps", type=int, default=100)
    parser.add_argument("--weight_decay", type=float, default=0.1)
    parser.add_argument("--beta2", type=float, default=0.99)
    parser.add_argument("--grad_clip", type=float, default=1.0)
    parser.add_argument("--eval_batches", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--compile", action="store_true", help="train through torch.compile (inductor)")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast (GPU runs)")


# ----------------------------------------------------------------------------------------------
# Config flags


def _own_config_fields() -> list[dataclasses.Field]:
    """The fields DDLmHCConfig declares (decoder + DDL-mHC), minus those the tokenizer sets."""
    own = DDLmHCConfig.__annotations__
    return [f for f in dataclasses.fields(DDLmHCConfig) if f.name in own and f.name not in TOKENIZER_FIELDS]


def _parse_value(text: str):
    """A flag value: JSON when it parses (numbers, true/false, null, dicts), else the raw string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("DDLmHCConfig fields (JSON values: 4, 1e-3, true, null, {...})")
    for field in _own_config_fields():
        default = SMALL_CPU_SHAPE.get(field.name, field.default)
        group.add_argument(f"--{field.name}", type=_parse_value, default=default, help=f"default {default!r}")


def config_from_args(args: argparse.Namespace, tokenizer, block_size: int) -> DDLmHCConfig:
    """DDLmHCConfig from the field flags; invalid values raise the config's ValueError/TypeError."""
    fields = {field.name: getattr(args, field.name) for field in _own_config_fields()}
    fields["max_position_embeddings"] = max(fields["max_position_embeddings"], block_size)
    return DDLmHCConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **fields,
    )


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    add_training_arguments(parser, steps=2000)
    parser.add_argument("--eval_interval", type=int, default=250)
    parser.add_argument("--sample_tokens", type=int, default=300)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--output_dir", default=str(REPO_ROOT / "outputs" / "ddl_mhc_char"))
    add_config_arguments(parser)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)

    tokenizer, train_ids, val_ids = load_corpus(args.data)
    tokenizer.model_max_length = args.block_size
    config = config_from_args(args, tokenizer, args.block_size)
    model = geoformers.DDLmHCForCausalLM(config).to(device)
    print(f"{model.num_parameters():,} parameters; {len(train_ids):,} train / {len(val_ids):,} val tokens")
    print(config.to_json_string(use_diff=True))

    def evaluate(split_ids) -> float:
        return estimate_loss(model, split_ids, args.batch_size, args.block_size, args.eval_batches, 0, device)

    history = []
    progress = tqdm(total=args.steps, desc="train", unit="step")

    def on_step(step: int, loss: float) -> None:
        progress.update(1)
        progress.set_postfix(loss=f"{loss:.4f}")
        if step % args.eval_interval == 0 or step == args.steps:
            record = {"step": step, "train_loss": evaluate(train_ids), "val_loss": evaluate(val_ids)}
            history.append(record)
            progress.write(f"step {step}: train {record['train_loss']:.4f}, val {record['val_loss']:.4f}")

    step = make_trainer(model, train_ids, args, device)
    seconds = []
    for index in range(1, args.steps + 1):
        loss, elapsed = step()
        seconds.append(elapsed)
        on_step(index, loss)
    progress.close()
    tokens_per_second = args.batch_size * args.block_size / sorted(seconds)[len(seconds) // 2]
    print(f"median training throughput: {tokens_per_second:,.0f} tokens/s")

    model.eval()
    prompt = torch.tensor([[tokenizer.bos_token_id]], device=device)
    sample = model.generate(
        prompt,
        max_new_tokens=args.sample_tokens,
        do_sample=True,
        temperature=args.temperature,
        pad_token_id=tokenizer.pad_token_id,
    )
    print("--- sample ---")
    print(tokenizer.decode(sample[0, 1:], skip_special_tokens=True))

    output_dir = Path(args.output_dir)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    (output_dir / "training_history.json").write_text(json.dumps(history, indent=2) + "\n")
    print(f"saved model and tokenizer to {output_dir}")


if __name__ == "__main__":
    main()

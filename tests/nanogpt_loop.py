"""nanoGPT's training loop as the causal-LM scripts ran it before they moved to the `Trainer`: the
independent reference that tests/test_lm_trainer.py compares the scripts' `Trainer` against (AdamW with
decay on tensors of two or more dimensions and none on the rest, linear warm-up and cosine decay to
`min_lr_ratio` x lr, gradient clipping, batches of random windows from a generator seeded with `seed`)."""

import torch
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from harness.random_windows import get_batch


def nanogpt_losses(model, ids, *, steps, batch_size, block_size, seed, learning_rate, weight_decay, beta2,
                   warmup_steps, min_lr_ratio, max_grad_norm) -> list[float]:  # fmt: skip
    """The training loss of each of `steps` steps."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, beta2))
    schedule = get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, num_warmup_steps=warmup_steps, num_training_steps=steps, min_lr_rate=min_lr_ratio
    )
    generator = torch.Generator().manual_seed(seed)
    model.train()
    losses = []
    for _ in range(steps):
        batch = get_batch(ids, batch_size, block_size, generator)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses

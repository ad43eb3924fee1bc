"""nanoGPT's batches as a dataset for the `Trainer` (docs/experiments.md, 'Shared causal-LM recipe'):
endless batches of random `block_size`-token windows of one token stream, drawn from a generator seeded with
`seed`, so every model trained from the same seed sees the same batches."""

import torch
from torch.utils.data import IterableDataset


def get_batch(ids: torch.Tensor, batch_size: int, block_size: int, generator: torch.Generator):
    """`batch_size` random windows of `block_size` tokens (the labels are the same tensor: HF shifts them)."""
    if len(ids) <= block_size:
        raise ValueError(f"the split has {len(ids)} tokens, fewer than block_size + 1 = {block_size + 1}")
    starts = torch.randint(len(ids) - block_size, (batch_size,), generator=generator)
    return torch.stack([ids[s : s + block_size] for s in starts.tolist()])


class RandomWindows(IterableDataset):
    """Rows `{"input_ids", "labels"}` (the same window), `batch_size` at a time from one `get_batch` call, so
    a `Trainer` with `per_device_train_batch_size=batch_size` trains on exactly nanoGPT's batches. Endless:
    give the Trainer `max_steps`. `skip_batches`: start where a run from the same seed is after that many
    batches (a branch that continues another run)."""

    def __init__(self, ids: torch.Tensor, batch_size: int, block_size: int, seed: int, skip_batches: int = 0):
        if len(ids) <= block_size:
            raise ValueError(f"the split has {len(ids)} tokens; --block_size={block_size} needs more")
        self.ids, self.batch_size, self.block_size, self.seed = ids, batch_size, block_size, seed
        self.skip_batches = skip_batches

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed)
        for _ in range(self.skip_batches):
            get_batch(self.ids, self.batch_size, self.block_size, generator)
        while True:
            for window in get_batch(self.ids, self.batch_size, self.block_size, generator):
                yield {"input_ids": window, "labels": window}

"""The causal-LM scripts' validation during a `Trainer` run (a `TrainerCallback`): every `eval_steps`
optimizer steps, the mean loss over fixed random windows (`harness.causal_lm.estimate_loss`, the same
windows for every model and call), as nanoGPT's `estimate_loss` does."""

from transformers import TrainerCallback

from harness.causal_lm import estimate_loss


class WindowLoss(TrainerCallback):
    """`history`: `{"step", "val_loss"}` after every `eval_steps` steps (0: never), not at the last step
    (the script evaluates the final model itself); `on_eval(step, loss)` is called with each."""

    def __init__(
        self, ids, batch_size: int, block_size: int, num_batches: int, eval_steps: int, on_eval=None
    ):
        self.ids, self.batch_size, self.block_size = ids, batch_size, block_size
        self.num_batches, self.eval_steps, self.on_eval = num_batches, eval_steps, on_eval
        self.history: list[dict] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        if not self.eval_steps or step % self.eval_steps or step == state.max_steps:
            return
        loss = estimate_loss(
            model, self.ids, self.batch_size, self.block_size, self.num_batches, 0, model.device
        )
        self.history.append({"step": step, "val_loss": loss})
        if self.on_eval is not None:
            self.on_eval(step, loss)

"""Shared pieces of the scripts (not part of the installed package; a script's own folder is on `sys.path`,
so the scripts import it as `harness`). Scripts share code only through this package, never by importing
one another (docs/experiments.md, 'Flags'):

* `flags`: the DDCL-INCRT experiments' shared command-line flags and the model they describe;
* `recipe`: the growth recipe on the stock `Trainer` (`run_growth_training`);
* `sst2`, `cov2`, `synthetic`: the task recipes of `exp_sst2.py`, `exp_cov2.py`, `exp_synthetic.py`;
* `printing`: growth events as they happen;
* `probes`: the exact gate spectrum, prototype probes, accuracy;
* `analysis`: the head-count law, grow order, how growth ended, temperatures;
* `causal_lm`: the causal-LM scripts' data, validation windows, nanoGPT's flags, their `Trainer` and the
  benchmark models;
* `lm_trainer`: the one builder of the DDL-mHC `Trainer` (`make_optimizer`), and the `TrainingArguments`
  flags of `finetune_lora.py`;
* `random_windows`, `window_loss`, `step_timer`, `round_robin`: nanoGPT's batches as a dataset, validation on
  fixed windows, step times, and several `Trainer` runs in lockstep;
* `flag_checks`: the flag policy (`CheckedParser`); `data_errors`: one line when a Hub dataset cannot load;
* `step_profile`, `peer_mhc`: the step profiler and the `hyper-connections` peer of `bench_causal_lm.py`;
* `threads`: `--threads` (default 1);
* `results`: result files (`write_results`), the environment, the reproducing command, markdown tables.
"""

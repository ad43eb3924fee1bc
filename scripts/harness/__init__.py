"""Shared pieces of the DDCL-INCRT experiment scripts (not part of the installed package; a script's own
folder is on `sys.path`, so the scripts import it as `harness`):

* `flags`: the shared command-line flags and the model they describe;
* `recipe`: the growth recipe on the stock `Trainer` (`run_growth_training`);
* `printing`: growth events as they happen;
* `probes`: the exact gate spectrum, prototype probes, accuracy;
* `analysis`: the head-count law, grow order, how growth ended, temperatures;
* `results`: result JSON, the environment, the reproducing command, markdown tables.
"""

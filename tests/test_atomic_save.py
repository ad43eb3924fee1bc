"""Atomic `save_pretrained`: a save killed (SIGKILL) at any point leaves the complete old model or the
complete new one, never a config of one with the weights of the other; other files of the folder survive."""

import os
import random
import signal
import time

import pytest
import torch
from transformers.utils import logging

from geoformers import DDLmHCConfig, DDLmHCForCausalLM
from geoformers.model_io import atomic_save
from geoformers.model_io.remote_code import remote_code_files

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the kill tests fork a saving process")


@pytest.fixture(scope="module", autouse=True)
def quiet_single_thread():
    """One thread (the forked savers must not inherit a thread pool) and no progress bars."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    logging.disable_progress_bar()
    yield
    logging.enable_progress_bar()
    torch.set_num_threads(threads)


def model(seed: int, rms_norm_eps: float) -> DDLmHCForCausalLM:
    """Two models of the same shapes, told apart by their weights (seed) and their config (rms_norm_eps)."""
    torch.manual_seed(seed)
    config = DDLmHCConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        hc_streams=2,
        rms_norm_eps=rms_norm_eps,
    )
    return DDLmHCForCausalLM(config)


@pytest.fixture(scope="module")
def two_models():
    return {"old": model(0, 1e-6), "new": model(1, 1e-5)}


def which(loaded, models) -> str:
    """The name of the model `loaded` equals in config and weights; fails for a mix."""
    by_config = [name for name, m in models.items() if m.config.rms_norm_eps == loaded.config.rms_norm_eps]
    weights = loaded.state_dict()
    by_weights = [
        name
        for name, m in models.items()
        if all(torch.equal(value, weights[key]) for key, value in m.state_dict().items())
    ]
    assert by_config == by_weights and len(by_config) == 1, (by_config, by_weights)
    return by_config[0]


def kill_during_saves(target, models, delays) -> list[str]:
    """For each delay: fork a process that saves the new and the old model over `target` in turn, SIGKILL it
    after `delay` seconds, and name the model `target` then loads as (or the error it raises)."""
    outcomes = []
    for delay in delays:
        pid = os.fork()
        if pid == 0:  # the saver: never returns to pytest
            try:
                while True:
                    for name in ("new", "old"):
                        models[name].save_pretrained(target)
            finally:
                os._exit(1)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        try:
            outcomes.append(which(DDLmHCForCausalLM.from_pretrained(target), models))
        except (OSError, ValueError) as error:  # a clear failure: killed between the two renames
            outcomes.append(f"{type(error).__name__}: {error}")
    return outcomes


def seeded_delays(count: int, save_seconds: float, seed: int = 0) -> list[float]:
    generator = random.Random(seed)
    return [generator.uniform(0.0, 3 * save_seconds) for _ in range(count)]


def run_kill_trials(tmp_path, models, count, seed=0) -> list[str]:
    target = tmp_path / "model"
    start = time.perf_counter()
    models["old"].save_pretrained(target)
    save_seconds = time.perf_counter() - start
    outcomes = kill_during_saves(target, models, seeded_delays(count, save_seconds, seed))
    # besides the model, only the hidden staging (or set-aside) folders of the killed saves
    assert all(p.name == "model" or p.name.startswith(".model.") for p in tmp_path.iterdir())
    return outcomes


def whole_or_absent(outcomes: list[str]) -> list[str]:
    """The outcomes that are neither a whole model nor the not-found error of a kill between the two
    renames (the folder briefly absent, docs/reliability.md, 'Saving')."""
    return [o for o in outcomes if o not in ("old", "new") and not ("config.json" in o and "not" in o)]


def test_a_save_killed_at_random_points_loads_as_the_old_or_the_new_model_or_not_at_all(tmp_path, two_models):
    outcomes = run_kill_trials(tmp_path, two_models, count=8)
    assert whole_or_absent(outcomes) == [], outcomes


@pytest.mark.slow
def test_a_save_killed_at_many_random_points_loads_as_the_old_or_the_new_model(tmp_path, two_models):
    outcomes = run_kill_trials(tmp_path, two_models, count=120, seed=1)
    assert whole_or_absent(outcomes) == [], outcomes
    assert {"old", "new"} <= set(outcomes), outcomes  # both sides of the swap were hit


def test_saving_over_a_folder_keeps_its_other_files_and_drops_stale_weight_shards(tmp_path, two_models):
    target = tmp_path / "run"
    two_models["old"].save_pretrained(target, max_shard_size="20KB")
    shards = sorted(p.name for p in target.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and (target / "model.safetensors.index.json").is_file()
    (target / "tokenizer.json").write_text("{}")
    (target / "checkpoint-5").mkdir()
    (target / "checkpoint-5" / "optimizer.pt").write_bytes(b"state")
    target.chmod(0o750)
    two_models["new"].save_pretrained(target)
    code = remote_code_files(
        "geoformers.models.ddl_mhc.modeling_ddl_mhc", "geoformers.models.ddl_mhc.configuration_ddl_mhc"
    )
    assert sorted(p.name for p in target.iterdir()) == sorted(
        [
            "checkpoint-5",
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            *code,
        ]
    )  # the Hub code is part of a save
    assert (target / "checkpoint-5" / "optimizer.pt").read_bytes() == b"state"
    assert target.stat().st_mode & 0o777 == 0o750
    assert which(DDLmHCForCausalLM.from_pretrained(target), two_models) == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no staging or replaced folder left behind


def test_a_failed_save_leaves_the_old_folder_and_no_staging_folder(tmp_path, two_models, monkeypatch):
    target = tmp_path / "model"
    two_models["old"].save_pretrained(target)

    def refuse(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(atomic_save, "carry_over", refuse)
    with pytest.raises(OSError, match="disk full"):
        two_models["new"].save_pretrained(target)
    assert which(DDLmHCForCausalLM.from_pretrained(target), two_models) == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_saved_files_follow_the_umask_as_files_transformers_opens(tmp_path, two_models, umask):
    """safetensors creates the weights 0600 whatever the umask; a save gives them config.json's mode."""
    previous = os.umask(umask)
    try:
        two_models["old"].save_pretrained(tmp_path / "model", max_shard_size="20KB")
    finally:
        os.umask(previous)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "model").iterdir()}
    assert any(name.endswith(".safetensors") for name in modes)
    assert set(modes.values()) == {0o666 & ~umask}, modes

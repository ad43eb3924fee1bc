"""FSDP2 (`fully_shard`) on two gloo CPU processes against the unsharded model (docs/multi_process.md,
'FSDP2'); the checks themselves are in tests/fsdp2_worker.py. Also: no 0-d parameter, and checkpoints saved
with the 0-d shapes of before still load."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from fsdp2_worker import CASES, run
from safetensors.torch import load_file, save_file

from geoformers import DDLmHCConfig, DDLmHCForCausalLM
from geoformers.models.ddl_mhc.modeling_ddl_mhc import ONE_ELEMENT_PARAMETERS

WORLD_SIZE = 2

pytestmark = pytest.mark.skipif(not dist.is_gloo_available(), reason="torch.distributed without gloo")


def spawn(tmp_path, case_names: list[str]) -> None:
    """All cases in one spawn: starting the processes (imports) costs more than a case."""
    mp.spawn(run, args=(WORLD_SIZE, str(tmp_path), case_names), nprocs=WORLD_SIZE, join=True)


def has_scalar_parameter(case_name: str) -> bool:
    return any(parameter.ndim == 0 for parameter in CASES[case_name].build(0).parameters())


def test_ddl_mhc_fsdp2_matches_unsharded(tmp_path):
    spawn(tmp_path, ["ddl_mhc-delta-rtbp"])


@pytest.mark.slow
def test_ddl_mhc_fsdp2_matches_unsharded_other_residuals_and_charts(tmp_path):
    spawn(tmp_path, ["ddl_mhc-add-rtbp", "ddl_mhc-delta-sinkhorn", "ddl_mhc-add-sinkhorn"])


def test_ddcl_incrt_fsdp2_matches_unsharded(tmp_path):
    spawn(tmp_path, ["ddcl_incrt"])


def test_ddl_mhc_has_no_scalar_parameter():
    shape = dict(
        vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4
    )
    for residual in ("delta", "add"):
        for res_mix in ("identity", "lazy"):
            model = DDLmHCForCausalLM(DDLmHCConfig(**shape, residual=residual, hc_res_mix=res_mix))
            assert [name for name, parameter in model.named_parameters() if parameter.ndim == 0] == []


def test_checkpoint_with_scalar_parameters_loads(tmp_path):
    """A checkpoint written when the gates and the chart weight were 0-d loads into the (1,) parameters, with
    `from_pretrained` and with `load_state_dict`, and is saved again 1-D."""
    torch.manual_seed(0)
    config = DDLmHCConfig(
        vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4
    )
    model = DDLmHCForCausalLM(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(ONE_ELEMENT_PARAMETERS):
                parameter.uniform_(-1.0, 1.0)  # away from the initial value a fresh model would get
    model.save_pretrained(tmp_path / "new")
    saved = load_file(tmp_path / "new" / "model.safetensors")
    old = {
        key: value.reshape(()) if key.endswith(ONE_ELEMENT_PARAMETERS) else value
        for key, value in saved.items()
    }
    assert sum(value.ndim == 0 for value in old.values()) == 2 * 2 * 4  # layers x sublayers x parameters
    model.save_pretrained(tmp_path / "old")
    save_file(old, tmp_path / "old" / "model.safetensors", metadata={"format": "pt"})

    loaded = DDLmHCForCausalLM.from_pretrained(tmp_path / "old")
    plain = DDLmHCForCausalLM(config)
    plain.load_state_dict(old)
    for other in (loaded, plain):
        for (key, expected), (other_key, value) in zip(
            model.state_dict().items(), other.state_dict().items(), strict=True
        ):
            assert key == other_key and value.shape == expected.shape and torch.equal(value, expected), key
    loaded.save_pretrained(tmp_path / "again")
    again = load_file(tmp_path / "again" / "model.safetensors")
    assert all(again[key].shape == (1,) for key in again if key.endswith(ONE_ELEMENT_PARAMETERS))

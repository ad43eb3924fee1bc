"""Growth under DistributedDataParallel: two CPU processes started by the command of
docs/model_doc/ddcl_incrt.md (`torchrun --nproc_per_node 2`, `TrainingArguments(use_cpu=True)`, gloo) grow
and prune heads during a Trainer run and must end with the same head counts, the same decisions and
bit-identical parameters; under `gate_rule="need"` they take the same checks on their averaged evidence."""

import json
import os
import subprocess
import sys
from pathlib import Path

from growth_worker import parameter_checksum
from transformers import AutoModelForSequenceClassification

WORKER = Path(__file__).resolve().parent / "growth_worker.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")  # torch's console script, beside the interpreter
MAX_STEPS = 30


def test_two_processes_take_the_same_decisions_and_end_with_identical_parameters(tmp_path):
    """The ranks start from different initial weights (DDP broadcasts rank 0's), see different data, and
    draw different random weights for each new head; gate statistics are averaged, new heads broadcast, and
    their gradients averaged by hooks (without these hooks the checksums differ)."""
    output_dir, result = tmp_path / "out", tmp_path / "result.json"
    assert TORCHRUN.is_file(), f"torch's torchrun script is missing beside {sys.executable}"
    command = [
        str(TORCHRUN),
        "--standalone",
        "--nproc_per_node",
        "2",
        str(WORKER),
        "ddp",
        "--output-dir",
        str(output_dir),
        "--result",
        str(result),
        "--max-steps",
        str(MAX_STEPS),
    ]
    completed = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"result.rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2] and len({r["pid"] for r in ranks}) == 2
    assert ranks[0]["num_heads"] == ranks[1]["num_heads"]
    assert ranks[0]["events"] == ranks[1]["events"] and ranks[0]["checks"] == ranks[1]["checks"]
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    actions = [event["action"] for event in ranks[0]["events"]]
    assert actions.count("grow") >= 2 and "prune" in actions  # heads added and removed after DDP wrapped
    assert all("ddp_find_unused_parameters=True" in r["refusal_without_find_unused"] for r in ranks)

    reloaded = AutoModelForSequenceClassification.from_pretrained(output_dir / f"checkpoint-{MAX_STEPS}")
    assert reloaded.config.num_heads == ranks[0]["num_heads"]
    assert parameter_checksum(reloaded) == ranks[0]["checksum"]


def test_the_need_rule_takes_the_same_checks_on_every_rank(tmp_path):
    """Each rank's monitor and probe rows differ (seeded by the rank); the loss, the model's error and the
    need evidence are averaged over the ranks, so the checks (evidence included) agree exactly, the rule
    grows, and the grown head starts from the first head's bank on both ranks."""
    result = tmp_path / "result.json"
    command = [
        str(TORCHRUN),
        "--standalone",
        "--nproc_per_node",
        "2",
        str(WORKER),
        "ddp-need",
        "--output-dir",
        str(tmp_path / "out"),
        "--result",
        str(result),
        "--max-steps",
        "20",
    ]
    completed = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"result.rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["checks"] == ranks[1]["checks"] and ranks[0]["events"] == ranks[1]["events"]
    assert all("need" in check for check in ranks[0]["checks"])
    assert "grow" in [event["action"] for event in ranks[0]["events"]]
    assert ranks[0]["num_heads"] == ranks[1]["num_heads"] and ranks[0]["checksum"] == ranks[1]["checksum"]
    assert ranks[0]["banks_copied"] and ranks[1]["banks_copied"]

"""The DDL-mHC benchmark script (docs/experiments.md, 'bench_causal_lm.py') writes its JSON report
(train_causal_lm.py: tests/test_train_causal_lm_script.py)."""

import json
import subprocess
import sys

import pytest
from script_modules import SCRIPTS


@pytest.mark.slow
def test_benchmark_writes_its_report(tmp_path, shared_data):
    output = tmp_path / "causal_lm.json"  # the default mode's name in --output_dir
    data = shared_data / "tinyshakespeare" / "input.txt"
    command = [
        *(sys.executable, str(SCRIPTS / "bench_causal_lm.py"), "--threads", "1", "--data", str(data)),
        *("--max_steps", "2", "--eval_batches", "1", "--gen_tokens", "4", "--gen_reps", "1"),
        *("--output_dir", str(tmp_path)),
        *("--variants", "llama (transformers)", "ddl-mhc n=1 add", "ddl-mhc n=4 delta rtbp"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(output.read_text())
    rows = {row["model"]: row for row in report["results"]}
    assert set(rows) == {"llama (transformers)", "ddl-mhc n=1 add", "ddl-mhc n=4 delta rtbp"}
    assert rows["llama (transformers)"]["train_throughput_ratio"] == 1.0
    # the n = 1 "add" ablation is Llama: same parameter count, same validation loss after the same steps
    assert rows["ddl-mhc n=1 add"]["parameters"] == rows["llama (transformers)"]["parameters"]
    llama_loss = rows["llama (transformers)"]["val_loss"]
    assert rows["ddl-mhc n=1 add"]["val_loss"] == pytest.approx(llama_loss, abs=1e-4)
    assert "| ddl-mhc n=4 delta rtbp |" in report["markdown"]

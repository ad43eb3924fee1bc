"""`push_to_hub` where the Hub cannot be reached names what the upload needs and the offline route
(`model_io/io_mixin.py`, `PretrainedIOMixin.push_to_hub`). The Hub endpoint is a closed port on the loopback
interface, so the request fails the way an offline machine's does, without touching any network. A saved
tokenizer loads where geoformers is not imported, with no "model of type" warning (docs/reliability.md)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import geoformers
model = geoformers.DDLmHCForCausalLM(geoformers.DDLmHCConfig(hidden_size=32, num_hidden_layers=1,
    num_attention_heads=2, intermediate_size=64, vocab_size=50, hc_streams=2))
try:
    model.push_to_hub("user/name")
except ConnectionError as error:
    print("ConnectionError:", error)
    print("cause:", type(error.__cause__).__name__)
"""


def test_push_to_hub_without_a_reachable_hub_says_what_it_needs(tmp_path):
    env = {
        "PYTHONPATH": str(ROOT.parent),
        "OMP_NUM_THREADS": "1",
        "PATH": "",
        "HOME": str(tmp_path),
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "HF_TOKEN": "hf_fake",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    run = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr
    message = run.stdout
    assert message.startswith("ConnectionError: push_to_hub could not reach the Hub at http://127.0.0.1:9")
    offline_route = "geoformers.export_for_hub(model, tokenizer, folder)"
    for needed in ("network connection", "write token", offline_route):
        assert needed in message
    assert "cause: ConnectError" in message  # the transport's own error stays attached


LOAD_TOKENIZER = """
import sys
from transformers import PreTrainedTokenizerFast
tokenizer = PreTrainedTokenizerFast.from_pretrained(sys.argv[1])
print(tokenizer("to be").input_ids, tokenizer.eos_token_id, "geoformers" in sys.modules)
"""


def test_saved_tokenizer_loads_without_geoformers_and_without_a_model_type_warning(tmp_path):
    from geoformers import DDLmHCConfig, DDLmHCForCausalLM
    from geoformers.tokenization import build_char_tokenizer

    tokenizer = build_char_tokenizer("to be, or not to be")
    model = DDLmHCForCausalLM(
        DDLmHCConfig(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            vocab_size=len(tokenizer),
            hc_streams=2,
        )
    )
    model.save_pretrained(tmp_path / "folder")
    tokenizer.save_pretrained(tmp_path / "folder")
    env = {"OMP_NUM_THREADS": "1", "PATH": "", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-c", LOAD_TOKENIZER, str(tmp_path / "folder")]
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    expected = f"{tokenizer('to be').input_ids} {tokenizer.eos_token_id} False"
    assert run.stdout.strip().splitlines()[-1] == expected
    assert "model of type" not in run.stderr

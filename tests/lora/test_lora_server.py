"""LoRA through the server with the official openai client: adapters chosen by the
``model`` field, listed in /v1/models, loaded and unloaded at run time. The oracle is
the offline LLM with the same adapter (itself checked against peft)."""

from __future__ import annotations

import httpx
import openai
import pytest

from minivllm import LLM, SamplingParams
from minivllm.lora import LoRARequest
from tests.lora.adapters import make_adapter
from tests.serve.harness import ENGINE_KWARGS

PROMPT = "def fibonacci(n):"
LORA_KWARGS = dict(enable_lora=True, max_loras=2, max_lora_rank=8)


@pytest.fixture(scope="module")
def adapters(llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    return [make_adapter(llama_dir, root / f"s{i}", rank=4, alpha=8, seed=40 + i) for i in range(2)]


@pytest.fixture(scope="module")
def server(make_engine, llama_dir, adapters):
    harness = make_engine(llama_dir, **ENGINE_KWARGS, **LORA_KWARGS)
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return harness.start_server(
        served_model_name="tiny",
        lora_modules=[f"sql={adapters[0]}"],
        enable_lora_runtime_updates=True,
        chat_template=template,
    )


@pytest.fixture(scope="module")
def offline(llama_dir, adapters):
    llm = LLM(str(llama_dir), **{**ENGINE_KWARGS, "num_gpu_blocks_override": 64}, **LORA_KWARGS)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

    def text(path):
        lora = None if path is None else LoRARequest(str(path), 100 + adapters.index(path), str(path))
        return llm.generate(PROMPT, params, use_tqdm=False, lora_request=lora)[0].outputs[0].text

    yield text
    llm.shutdown()


def _complete(client, model):
    out = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
    )
    assert out.model == model
    return out.choices[0].text


def test_model_field_selects_the_adapter(client, offline, adapters):
    assert [m.id for m in client.models.list().data] == ["tiny", "sql"]
    base, sql = _complete(client, "tiny"), _complete(client, "sql")
    assert base == offline(None) and sql == offline(adapters[0]) and base != sql
    chat = client.chat.completions.create(model="sql", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert chat.model == "sql"


def test_unknown_model_is_a_404_in_openai_shape(client, server):
    with pytest.raises(openai.NotFoundError) as err:
        _complete(client, "no-such-adapter")
    assert err.value.status_code == 404
    body = httpx.post(f"{server.base_url}/v1/completions", json={"model": "nope", "prompt": "x"}, timeout=30).json()
    assert body["error"]["type"] == "NotFoundError" and body["error"]["param"] == "model"


def test_load_and_unload_at_run_time(client, server, offline, adapters, tmp_path):
    url = server.base_url
    loaded = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "new", "lora_path": str(adapters[1])})
    assert loaded.status_code == 200
    assert "new" in [m.id for m in client.models.list().data]
    assert _complete(client, "new") == offline(adapters[1])
    bad = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": str(tmp_path)})
    assert bad.status_code == 400 and "missing adapter_config.json" in bad.json()["error"]["message"]
    assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "new"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        _complete(client, "new")
    assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "new"}).status_code == 404
    assert _complete(client, "sql") == offline(adapters[0])  # still serving


@pytest.mark.parametrize(
    "config,weights,needle",
    [
        ("[1, 2]", None, "adapter_config.json must hold a JSON object, not a list"),
        ("{not json", None, "adapter_config.json is not valid JSON"),
        (None, b"not safetensors at all", "adapter_model.safetensors is not a safetensors file"),
    ],
)
def test_a_malformed_adapter_is_a_400_naming_the_file(client, server, adapters, tmp_path, config, weights, needle):
    folder = tmp_path / "broken"
    folder.mkdir()
    source = adapters[1]
    (folder / "adapter_config.json").write_text(config or (source / "adapter_config.json").read_text())
    (folder / "adapter_model.safetensors").write_bytes(weights or (source / "adapter_model.safetensors").read_bytes())
    res = httpx.post(f"{server.base_url}/v1/load_lora_adapter", json={"lora_name": "broken", "lora_path": str(folder)})
    assert res.status_code == 400, res.text
    assert needle in res.json()["error"]["message"]
    assert "Traceback" not in res.text
    assert _complete(client, "sql")  # still serving

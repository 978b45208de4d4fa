"""Qwen3-Next (hybrid linear attention) against transformers' ``generate`` (greedy, fp32) on a
tiny checkpoint built here: three Gated DeltaNet layers and one gated full-attention layer, MoE
with a gated shared expert. Alone and under chunked prefill with a tiny token budget (the
states carried across chunks), preemption with a tiny cache (slots freed, recomputed), async
scheduling and tp=2; prefix caching refused when asked for, off by default.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from minivllm import LLM, SamplingParams
from tests.hf_reference import hf_greedy
from tests.model_configs import qwen3_next_config

MAX_TOKENS = 8
PROMPT_LENS = (3, 9, 23, 70)  # 70: two chunks of the chunked delta rule (64 tokens each)


@pytest.fixture(scope="module")
def qwen3_next_dir(make_checkpoint):
    return make_checkpoint("qwen3-next", qwen3_next_config())


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(17)
    return [torch.randint(4, 500, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def _llm(ckpt, **kwargs) -> LLM:
    args = dict(dtype="float32", block_size=4, num_gpu_blocks_override=64, max_model_len=96, seed=0)
    return LLM(model=str(ckpt), **{**args, **kwargs})


def _generate(ckpt, prompts, **kwargs):
    llm = _llm(ckpt, **kwargs)
    try:
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=0, ignore_eos=True)
        return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    finally:
        llm.shutdown()


def _assert_matches(outputs, reference) -> None:
    for out, (tokens, logprobs) in zip(outputs, reference, strict=True):
        completion = out.outputs[0]
        assert completion.token_ids == tokens
        ours = [lp[t] for lp, t in zip(completion.logprobs, completion.token_ids)]
        assert ours == pytest.approx(logprobs, abs=1e-4)


@pytest.fixture(scope="module")
def reference(qwen3_next_dir):
    prompts = _prompts()
    return prompts, hf_greedy(qwen3_next_dir, prompts, MAX_TOKENS)


def test_greedy_matches_transformers(qwen3_next_dir, reference) -> None:
    prompts, ref = reference
    _assert_matches(_generate(qwen3_next_dir, prompts), ref)


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("chunked-prefill-budget-8", dict(max_num_batched_tokens=8, enable_chunked_prefill=True)),
        ("preemption-30-blocks", dict(num_gpu_blocks_override=30)),
        ("async-scheduling-chunked", dict(async_scheduling=True, max_num_batched_tokens=8)),
        ("tp2", dict(tensor_parallel_size=2)),
        ("tp2-chunked-prefill", dict(tensor_parallel_size=2, max_num_batched_tokens=8, enable_chunked_prefill=True)),
        ("async-scheduling-preemption", dict(async_scheduling=True, num_gpu_blocks_override=30)),
        ("two-slots-reused", dict(max_num_seqs=2)),  # later requests take slots holding finished ones' states
    ],
)
def test_combinations_match_transformers(qwen3_next_dir, reference, name, kwargs) -> None:
    prompts, ref = reference
    _assert_matches(_generate(qwen3_next_dir, prompts, **kwargs), ref)


def test_the_triton_ops_in_the_engine_match_transformers(qwen3_next_dir, reference, monkeypatch) -> None:
    """CUDA's Gated DeltaNet kernels (interpreted here) wired into the model: prefill in chunks of 8
    (a state carried between chunked-form calls), then recurrent decode steps."""
    from minivllm.layers.ops import triton_gated_delta_net
    from minivllm.models import qwen3_next

    used = []

    def triton_ops(device):
        used.append(device)
        return triton_gated_delta_net

    monkeypatch.setattr(qwen3_next, "gated_delta_ops", triton_ops)
    prompts, ref = reference
    kwargs = dict(max_num_batched_tokens=8, enable_chunked_prefill=True)
    _assert_matches(_generate(qwen3_next_dir, prompts[:3], **kwargs), ref[:3])
    assert used


def test_kv_spec_reports_blocks_and_state_slots(qwen3_next_dir) -> None:
    """The exact budget pays for ``max_num_seqs`` state slots first, the KV blocks get the rest;
    the spec reports both at their real sizes (fp32, the test shape)."""
    budget, block_size, seqs = 1 << 20, 4, 6
    llm = _llm(qwen3_next_dir, num_gpu_blocks_override=None, kv_cache_memory_bytes=budget, max_num_seqs=seqs)
    try:
        spec = llm.llm_engine.core.kv_spec
        conv = (2 * 2 * 8 + 4 * 8) * (4 - 1) * 4  # q, k, v channels x (K - 1) inputs, fp32
        recurrent = 4 * 8 * 8 * 4  # value heads x Dk x Dv, fp32
        assert spec.num_state_slots == seqs
        assert spec.state_slot_bytes == 3 * (conv + recurrent)  # three linear-attention layers
        assert spec.block_bytes == 1 * 2 * 2 * 16 * 4 * block_size  # one full-attention layer: K and V, 2 heads
        assert spec.num_blocks == (budget - seqs * spec.state_slot_bytes) // spec.block_bytes
    finally:
        llm.shutdown()


def _config(ckpt, *overrides: str):
    from minivllm.config.store import build_config

    return build_config([f"model.path={ckpt}", *overrides])


def test_prefix_caching_refused_when_asked_and_off_by_default(qwen3_next_dir, llama_dir, caplog) -> None:
    with pytest.raises(ValueError, match=r"cache.enable_prefix_caching=true.*linear-attention layers \[0, 1, 2\]"):
        _config(qwen3_next_dir, "cache.enable_prefix_caching=true")
    with caplog.at_level("INFO"):
        assert _config(qwen3_next_dir).cache.enable_prefix_caching is False
    assert "Prefix caching off" in caplog.text
    assert _config(qwen3_next_dir, "cache.enable_prefix_caching=false").cache.enable_prefix_caching is False
    assert _config(llama_dir).cache.enable_prefix_caching is True  # other models: on by default


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["speculative.method=ngram", "speculative.num_speculative_tokens=2"], "speculative.method=ngram"),
        (["lora.enable_lora=true"], "lora.enable_lora=true"),
        (["parallel.pp=2"], "parallel.pp=2"),
    ],
)
def test_unsupported_options_are_refused(qwen3_next_dir, overrides, key) -> None:
    with pytest.raises(ValueError, match=f"{key}: not supported with Qwen3NextForCausalLM"):
        _config(qwen3_next_dir, *overrides)


def test_fp8_kv_cache_for_the_attention_layers(qwen3_next_dir, reference) -> None:
    """fp8 keys and values in the full-attention layer (a quarter of the bytes of fp32 per block),
    the linear-attention states in the model's dtype: the greedy tokens stay transformers'."""
    prompts, ref = reference
    llm = _llm(qwen3_next_dir, kv_cache_dtype="fp8")
    try:
        spec = llm.llm_engine.core.kv_spec
        assert spec.block_bytes == 2 * 2 * 16 * 1 * 4  # K and V, 2 heads of 16, one byte, block of 4
        assert spec.state_slot_bytes == 3 * ((2 * 2 * 8 + 4 * 8) * 3 * 4 + 4 * 8 * 8 * 4)  # states stay fp32
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=0, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    finally:
        llm.shutdown()
    # fp8 rounding moves the logprobs (by up to ~0.5 nats on this random checkpoint), not the choices
    assert [o.outputs[0].token_ids for o in outs] == [tokens for tokens, _ in ref]


TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@torch.no_grad()
def test_openai_chat_with_the_checkpoints_template_matches_transformers(
    qwen3_next_dir, tmp_path, make_engine, openai_client
) -> None:
    """The server renders the checkpoint's own chat template; the reply is transformers' greedy text."""
    ckpt = tmp_path / "qwen3-next-chat"
    shutil.copytree(qwen3_next_dir, ckpt)
    tok_config = json.loads((ckpt / "tokenizer_config.json").read_text())
    (ckpt / "tokenizer_config.json").write_text(json.dumps({**tok_config, "chat_template": TEMPLATE}))
    server = make_engine(ckpt).start_server()
    client = openai_client(server)
    messages = [{"role": "user", "content": "def add(a, b):"}]
    chat = client.chat.completions.create(model=server.model_name, messages=messages, max_tokens=8, temperature=0)

    tokenizer = server.harness.engine.tokenizer
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tokenizer.decode(ids).endswith("<|assistant|>\n")
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    for _ in range(8):  # greedy, one token at a time (transformers' generate would stop at eos)
        ids = ids + [int(hf(input_ids=torch.tensor([ids])).logits[0, -1].argmax())]
    expected = tokenizer.decode(ids[-8:], skip_special_tokens=True)
    assert chat.choices[0].message.content == expected
    assert chat.usage.completion_tokens == 8


def _chosen_logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """(len(tokens),) the model's fp32 logprob of each of ``tokens`` after ``prompt`` and the ones before it."""
    logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


@torch.no_grad()
def test_bf16_drifts_from_fp32_no_more_than_transformers_bf16(make_checkpoint) -> None:
    """bf16 weights (every expert active: no routing flips): on each prompt our logprobs stray from
    transformers' fp32 ones no more than transformers' own bf16 does, plus a margin (this random
    checkpoint is bf16-sensitive: transformers' bf16 moves it by ~0.8 nats; a mis-loaded weight, by more)."""
    config = qwen3_next_config()
    config.num_experts_per_tok = config.num_experts
    ckpt = make_checkpoint("qwen3-next-every-expert", config)
    prompts = _prompts()[:3]
    llm = _llm(ckpt, dtype="bfloat16")
    try:
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=0, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    finally:
        llm.shutdown()
    fp32 = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    bf16 = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16).eval()
    for prompt, out in zip(prompts, outs):
        tokens = out.outputs[0].token_ids
        ref, hf_bf16 = (_chosen_logprobs(model, prompt, tokens) for model in (fp32, bf16))
        ours = torch.tensor([lp[t].logprob for lp, t in zip(out.outputs[0].logprobs, tokens)])
        assert (ours - ref).abs().max() <= (hf_bf16 - ref).abs().max() + 0.3


def test_models_without_linear_layers_hold_no_state_slots(llama_dir) -> None:
    """A model with no linear-attention layers: no slots in the spec or the manager, none sent
    with a request, nothing in the runner's step (``state_slots`` None)."""
    llm = LLM(model=str(llama_dir), dtype="float32", block_size=4, num_gpu_blocks_override=16, max_model_len=64)
    try:
        core = llm.llm_engine.core
        assert (core.kv_spec.num_state_slots, core.kv_spec.state_slot_bytes) == (0, 0)
        assert core.scheduler.kv.num_state_slots == 0
        assert llm.collective_rpc(lambda w: w.model_runner.state_slots) == [None]
    finally:
        llm.shutdown()


def test_linear_layers_from_layer_types_or_the_interval() -> None:
    from types import SimpleNamespace

    from minivllm.config.model import linear_attention_layers

    assert linear_attention_layers(qwen3_next_config()) == [0, 1, 2]
    no_types = SimpleNamespace(
        model_type="qwen3_next", num_hidden_layers=8, full_attention_interval=4, layer_types=None
    )
    assert linear_attention_layers(no_types) == [0, 1, 2, 4, 5, 6]
    gemma_like = SimpleNamespace(model_type="gemma3_text", layer_types=["sliding_attention", "full_attention"])
    assert linear_attention_layers(gemma_like) == []


@pytest.mark.gpu
@pytest.mark.parametrize(
    "extra", [{}, dict(max_num_batched_tokens=8, enable_chunked_prefill=True)], ids=["plain", "chunked"]
)
def test_cuda_matches_transformers(qwen3_next_dir, reference, extra) -> None:
    """On CUDA (Triton attention for the full-attention layer, the Triton state kernels, decode
    steps in CUDA graphs): transformers' greedy tokens, logprobs within 1e-3 (fp32 on the GPU)."""
    prompts, ref = reference
    outs = _generate(qwen3_next_dir, prompts, device="cuda", **extra)
    for out, (tokens, logprobs) in zip(outs, ref, strict=True):
        assert out.outputs[0].token_ids == tokens
        ours = [lp[t] for lp, t in zip(out.outputs[0].logprobs, tokens)]
        assert ours == pytest.approx(logprobs, abs=1e-3)

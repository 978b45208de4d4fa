"""DeepSeek V2/V3 (Multi-head Latent Attention) beyond the parity table.

The MLA attention forms against each other and a dense reference; the latent
cache and what it costs (``cache.kv_cache_memory_bytes``); and the models
against transformers under chunked prefill, preemption, prefix caching, async
scheduling, tp=2 and an fp8 latent cache.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from minivllm import LLM, SamplingParams
from minivllm.attention.backend import AttentionMetadata
from minivllm.attention.kv_quant import FP8_KV_DTYPE
from minivllm.attention.mla import mla_attention, write_latent
from tests.executor import tp_helpers as h
from tests.model_configs import deepseek_v2_config, deepseek_v3_config

PROMPT_LENS = (3, 8, 13, 21)
MAX_TOKENS = 10
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=0, ignore_eos=True)


@pytest.fixture(scope="module")
def v3_dir(make_checkpoint):
    return make_checkpoint("deepseek-v3-mla-yarn-grouped-sigmoid-router", deepseek_v3_config())


@pytest.fixture(scope="module")
def v2_dir(make_checkpoint):
    return make_checkpoint("deepseek-v2-lite-mla-greedy-router", deepseek_v2_config())


def _prompts(shared_prefix: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1234)
    head = torch.randint(4, 512, (shared_prefix,), generator=gen).tolist()
    return [head + torch.randint(4, 512, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def _generate(ckpt, prompts, **kwargs):
    kwargs = {"dtype": "float32", "block_size": 8, "num_gpu_blocks_override": 64, **kwargs}
    llm = LLM(model=str(ckpt), **kwargs)
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
        return [o.outputs[0] for o in outs], llm.llm_engine.scheduler_stats()
    finally:
        llm.shutdown()


@torch.no_grad()
def _assert_matches_transformers(ckpt, prompts, outputs, atol: float = 1e-4) -> None:
    """transformers' argmax at every generated position is the token we chose, and its logprob ours."""
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager").eval()
    for prompt, out in zip(prompts, outputs, strict=True):
        tokens = list(out.token_ids)
        assert len(tokens) == MAX_TOKENS
        logits = hf(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        ref = logits.float().log_softmax(dim=-1)
        assert ref.argmax(dim=-1).tolist() == tokens, f"greedy tokens differ for a {len(prompt)}-token prompt"
        ours = torch.tensor([lp[t] for t, lp in zip(tokens, out.logprobs)])
        torch.testing.assert_close(ours, ref.gather(1, torch.tensor(tokens)[:, None])[:, 0], atol=atol, rtol=0)


# ---- the attention forms ------------------------------------------------------------


def _mixed_step(
    block_size: int = 4,
    r: int = 16,
    dr: int = 8,
    dtype=torch.float32,
    k_scale: float = 1.0,
    query_lens=(5, 1, 1),
    seq_lens=(11, 9, 3),
):
    """Three requests in one step over a paged latent cache with shuffled blocks (at most 16
    positions each): by default a 5-token prefill chunk after 6 cached tokens, and two decode
    tokens at lengths 9 and 3."""
    gen = torch.Generator().manual_seed(0)
    query_lens, seq_lens = list(query_lens), list(seq_lens)
    num_blocks = 16
    tables = torch.randperm(num_blocks, generator=gen)[:12].view(3, 4).int()
    cache = torch.zeros(num_blocks, block_size, 1, r + dr, dtype=dtype)
    context = [torch.randn(n - q, r + dr, generator=gen) for n, q in zip(seq_lens, query_lens)]

    def slots(i: int, positions: range) -> list[int]:
        return [int(tables[i, p // block_size]) * block_size + p % block_size for p in positions]

    for i, ctx in enumerate(context):  # the tokens cached by earlier steps
        write_latent(ctx, cache, torch.tensor(slots(i, range(len(ctx))), dtype=torch.int64), k_scale)
    new_slots = [s for i in range(3) for s in slots(i, range(seq_lens[i] - query_lens[i], seq_lens[i]))]
    starts = np.concatenate([[0], np.cumsum(query_lens)])
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(new_slots),
        query_start_loc=torch.from_numpy(starts).int(),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=tables,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_lens_cpu=query_lens,
        seq_lens_cpu=seq_lens,
        has_padding=False,
    )
    return cache, meta, context, gen


def _reference(q_nope, q_pe, latents, w_uk, w_uv, scale, q_pos):
    """Dense per-head attention for one request: latents (L, r + dr) expanded, causal."""
    r = w_uk.shape[-1]
    k = torch.cat((torch.einsum("lr,hdr->hld", latents[:, :r], w_uk), latents[:, r:].expand(w_uk.shape[0], -1, -1)), -1)
    v = torch.einsum("lr,hvr->hlv", latents[:, :r], w_uv)
    q = torch.cat((q_nope, q_pe), -1).transpose(0, 1)  # (H, Q, dn + dr)
    scores = (q @ k.transpose(1, 2)) * scale  # (H, Q, L)
    hidden = torch.arange(len(latents)).view(1, 1, -1) > torch.tensor(q_pos).view(1, -1, 1)
    probs = F.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
    return (probs @ v).transpose(0, 1)  # (Q, H, dv)


@pytest.mark.parametrize("piece", [1, 4, 6, 64])
def test_expanded_context_in_pieces_equals_the_whole_context(piece, monkeypatch):
    """A 5-token chunk after 18 context positions, the context expanded ``piece`` positions at a
    time (4 does not divide 18; 64 is one piece) and merged by log-sum-exp: the output of the
    whole context expanded at once."""
    from minivllm.attention import mla

    H, dn, dv, r, dr, n, length = 3, 16, 12, 16, 8, 5, 23
    gen = torch.Generator().manual_seed(5)
    q_nope, q_pe = torch.randn(1, n, H, dn, generator=gen), torch.randn(1, n, H, dr, generator=gen)
    lat = torch.randn(1, length + 3, r + dr, generator=gen)  # 3 gathered slots past the end
    w_uk, w_uv = torch.randn(H, dn, r, generator=gen) / 4, torch.randn(H, dv, r, generator=gen) / 4
    q_pos = torch.arange(length - n, length).view(1, n)
    whole = mla._expanded(q_nope, q_pe, lat, q_pos, w_uk, w_uv, 0.3)
    pieces = []
    monkeypatch.setattr(mla, "CONTEXT_CHUNK_TOKENS", piece)
    original = mla._partial
    monkeypatch.setattr(mla, "_partial", lambda q, lat, *a: pieces.append(lat.shape[1]) or original(q, lat, *a))
    got = mla._expanded_in_pieces(q_nope, q_pe, lat, q_pos, w_uk, w_uv, 0.3)
    assert pieces == [n] + [min(piece, 18 - i) for i in range(0, 18, piece)]  # never more than a piece at once
    torch.testing.assert_close(got, whole, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("absorb", [None, True, False], ids=["auto", "absorbed", "expanded"])
def test_mla_forms_match_dense_attention(absorb):
    """Decode absorbed and prefill expanded (the default), or either form for every request,
    give dense per-head attention over the same latents: the new ones land in the cache too."""
    H, dn, dr, dv, r = 4, 16, 8, 12, 16
    cache, meta, context, gen = _mixed_step(r=r, dr=dr)
    T = meta.num_tokens
    q_nope, q_pe = torch.randn(T, H, dn, generator=gen), torch.randn(T, H, dr, generator=gen)
    new = torch.randn(T, r + dr, generator=gen)
    w_uk, w_uv = torch.randn(H, dn, r, generator=gen) / 4, torch.randn(H, dv, r, generator=gen) / 4
    out = mla_attention(q_nope, q_pe, new, cache, meta, w_uk=w_uk, w_uv=w_uv, scale=0.3, absorb=absorb)
    start = 0
    for ctx, n, seq_len in zip(context, meta.query_lens_cpu, meta.seq_lens_cpu):
        latents = torch.cat((ctx, new[start : start + n]))
        ref = _reference(
            q_nope[start : start + n],
            q_pe[start : start + n],
            latents,
            w_uk,
            w_uv,
            0.3,
            list(range(seq_len - n, seq_len)),
        )
        torch.testing.assert_close(out[start : start + n], ref, atol=1e-5, rtol=1e-5)
        start += n


def test_mla_fp8_latent_cache_stays_close():
    """An fp8 cache stores latent / k_scale in one byte a value; attention reads it back scaled."""
    H, dn, dr, dv, r = 4, 16, 8, 12, 16
    outs = []
    for dtype in (torch.float32, FP8_KV_DTYPE):
        cache, meta, _, gen = _mixed_step(r=r, dr=dr, dtype=dtype, k_scale=0.5)
        T = meta.num_tokens
        q_nope, q_pe = torch.randn(T, H, dn, generator=gen), torch.randn(T, H, dr, generator=gen)
        new = torch.randn(T, r + dr, generator=gen)
        w_uk, w_uv = torch.randn(H, dn, r, generator=gen) / 4, torch.randn(H, dv, r, generator=gen) / 4
        outs.append(mla_attention(q_nope, q_pe, new, cache, meta, w_uk=w_uk, w_uv=w_uv, scale=0.3, k_scale=0.5))
    assert cache.dtype == FP8_KV_DTYPE
    torch.testing.assert_close(outs[1], outs[0], atol=0.1, rtol=0.1)
    assert not torch.equal(outs[1], outs[0])  # the fp8 rounding is really there


# ---- the latent cache and what it costs ----------------------------------------------


def test_latent_cache_holds_four_times_the_tokens_of_per_head_kv(v3_dir):
    """With the same ``kv_cache_memory_bytes``, the latent cache (16 + 8 values per token and
    layer) holds >= 4x the tokens a cache of expanded K/V (4 heads x (16 + 8 + 12)) would."""
    budget = 1 << 20
    llm = LLM(model=str(v3_dir), dtype="float32", block_size=8, kv_cache_memory_bytes=budget, max_model_len=128)
    try:
        spec = llm.llm_engine.core.kv_spec
        caches = llm.llm_engine.core.executor.collective_rpc(
            lambda w: [tuple(c.shape) for c in w.model_runner.kv_caches]
        )
    finally:
        llm.shutdown()
    config = deepseek_v3_config()
    layers, latent = config.num_hidden_layers, config.kv_lora_rank + config.qk_rope_head_dim
    assert caches[0] == [(spec.num_blocks, 8, 1, latent)] * layers  # no per-head K/V anywhere
    assert spec.bytes_per_token == layers * latent * 4
    assert spec.num_blocks == budget // spec.block_bytes  # the budget, exactly
    expanded_per_token = (
        layers
        * config.num_attention_heads
        * (config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim)
        * 4
    )
    assert spec.num_tokens >= 4 * (budget // expanded_per_token)


def test_kv_cache_memory_bytes_is_a_hydra_key_and_an_llm_keyword(llama_dir):
    from minivllm.config.llm_kwargs import config_from_kwargs
    from minivllm.config.store import build_config

    cfg = build_config([f"model.path={llama_dir}", "cache.kv_cache_memory_bytes=1048576"])
    assert cfg.cache.kv_cache_memory_bytes == 1 << 20
    assert config_from_kwargs(str(llama_dir), kv_cache_memory_bytes=1 << 20).cache.kv_cache_memory_bytes == 1 << 20
    with pytest.raises(ValueError, match="cache.kv_cache_memory_bytes=-5"):
        build_config([f"model.path={llama_dir}", "cache.kv_cache_memory_bytes=-5"])


def test_kv_cache_memory_bytes_sets_the_budget_and_is_checked(llama_dir):
    """It overrides the memory fraction (a tiny cpu_memory_gb would leave nothing), and a budget
    below one block, or one set beside num_gpu_blocks_override, fails naming the key."""
    llm = LLM(model=str(llama_dir), dtype="float32", block_size=8, kv_cache_memory_bytes=3 << 20, cpu_memory_gb=0.001)
    try:
        spec = llm.llm_engine.core.kv_spec
        assert spec.num_blocks == (3 << 20) // spec.block_bytes
        # Llama's test shape: 2 layers x 2 (K, V) x 2 kv heads x 16 head_dim, fp32
        assert spec.bytes_per_token == 2 * 2 * 2 * 16 * 4
    finally:
        llm.shutdown()
    with pytest.raises(ValueError, match="cache.kv_cache_memory_bytes=100: less than one KV block"):
        LLM(model=str(llama_dir), dtype="float32", kv_cache_memory_bytes=100)
    with pytest.raises(ValueError, match="kv_cache_memory_bytes and cache.num_gpu_blocks_override"):
        LLM(model=str(llama_dir), kv_cache_memory_bytes=1 << 20, num_gpu_blocks_override=8)
    with pytest.raises(ValueError, match="cache.kv_cache_memory_bytes"):
        LLM(model=str(llama_dir), kv_cache_memory_bytes=0)


# ---- the models against transformers, in combination ---------------------------------


@pytest.mark.parametrize("which", ["v2", "v3"])
def test_chunked_prefill_tiny_budget_and_async_match_transformers(which, v2_dir, v3_dir):
    """A 4-token step budget: every prompt but one is cut into chunks that attend to the
    latents of earlier chunks (expanded form) beside other requests' decode tokens."""
    ckpt = v2_dir if which == "v2" else v3_dir
    prompts = _prompts()
    outs, _ = _generate(
        ckpt, prompts, max_num_batched_tokens=4, max_num_seqs=4, max_model_len=64, async_scheduling=True
    )
    _assert_matches_transformers(ckpt, prompts, outs)


def test_preemption_with_a_tiny_cache_matches_transformers(v3_dir):
    prompts = _prompts()
    outs, stats = _generate(v3_dir, prompts, num_gpu_blocks_override=5, max_model_len=40)
    assert stats.num_preemptions > 0
    _assert_matches_transformers(v3_dir, prompts, outs)


@pytest.mark.parametrize("which", ["v2", "v3"])
def test_prefix_hits_longer_than_the_context_piece_match_transformers(which, v2_dir, v3_dir, monkeypatch):
    """Prompts sharing a 24-token head with prefix caching, cut into 8-token chunks, and a
    5-position context piece: each chunk's context (cached blocks, earlier chunks) is expanded
    in pieces and merged by log-sum-exp; transformers' tokens and logprobs."""
    from minivllm.attention import mla

    ckpt = v2_dir if which == "v2" else v3_dir
    monkeypatch.setattr(mla, "CONTEXT_CHUNK_TOKENS", 5)
    contexts = []
    original = mla._expanded_in_pieces

    def spy(q_nope, q_pe, lat, q_pos, *args):
        contexts.append(int(q_pos[0, 0]))  # positions before the chunk
        return original(q_nope, q_pe, lat, q_pos, *args)

    monkeypatch.setattr(mla, "_expanded_in_pieces", spy)
    prompts = _prompts(shared_prefix=24)
    outs, stats = _generate(
        ckpt, prompts, enable_prefix_caching=True, max_num_batched_tokens=8, max_num_seqs=2, max_model_len=64
    )
    assert stats.prefix_cache_hits > 0
    assert max(contexts) > 3 * 5  # contexts of several pieces were attended to
    _assert_matches_transformers(ckpt, prompts, outs)


def _set_context_piece(tokens: int):
    """A ``collective_rpc`` function: every rank's MLA context piece set to ``tokens`` positions,
    the one it had returned."""

    def set_piece(worker) -> int:
        from minivllm.attention import mla

        before, mla.CONTEXT_CHUNK_TOKENS = mla.CONTEXT_CHUNK_TOKENS, tokens
        return before

    return set_piece


def test_tp2_prefix_hits_in_context_pieces_match_transformers(v3_dir):
    """tp=2 (each rank its half of the heads), prefix caching, 8-token chunks and a 5-position
    context piece on every rank: transformers' tokens and logprobs."""
    prompts = _prompts(shared_prefix=24)
    llm = LLM(
        model=str(v3_dir),
        tensor_parallel_size=2,
        enable_prefix_caching=True,
        max_num_batched_tokens=8,
        max_num_seqs=2,
        **{**h.LLM_KWARGS, "max_model_len": 64},
    )
    try:
        before = llm.collective_rpc(_set_context_piece(5))
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
        stats = llm.llm_engine.scheduler_stats()
        assert llm.collective_rpc(_set_context_piece(before[0])) == [5, 5]
    finally:
        llm.shutdown()
    assert stats.prefix_cache_hits > 0
    _assert_matches_transformers(v3_dir, prompts, [o.outputs[0] for o in outs])


def test_prefix_caching_reuses_latent_blocks(v2_dir):
    """Four prompts sharing a 16-token head: later ones read its latents from cached blocks."""
    prompts = _prompts(shared_prefix=16)
    outs, stats = _generate(v2_dir, prompts, enable_prefix_caching=True, max_num_seqs=1)
    assert stats.prefix_cache_hits > 0
    _assert_matches_transformers(v2_dir, prompts, outs)


def test_fp8_latent_cache_generates_close_to_fp32(v3_dir):
    """``kv_cache_dtype=fp8`` stores the latent in one byte a value (a quarter of fp32's block)."""
    prompts = _prompts()
    fp8, _ = _generate(v3_dir, prompts, kv_cache_dtype="fp8")
    full, _ = _generate(v3_dir, prompts)
    for a, b in zip(fp8, full):
        assert len(a.token_ids) == MAX_TOKENS
        assert a.token_ids[0] == b.token_ids[0]  # the first token reads the prompt's latents back from fp8


@pytest.mark.parametrize("which", ["v2", "v3-expert-parallel"])
def test_tp2_replicates_the_latent_and_splits_heads(which, v2_dir, v3_dir):
    """tp=2 gives tp=1's tokens and logprobs: V2 with q_proj and each expert sliced, V3 with the
    low-rank q and expert parallelism (each rank holds 4 whole experts)."""
    ckpt = v2_dir if which == "v2" else v3_dir
    llm = LLM(model=str(ckpt), tensor_parallel_size=2, enable_expert_parallel="expert" in which, **h.LLM_KWARGS)
    try:
        h.assert_same_outputs(h.reference(ckpt), h.generate(llm))
        shapes = llm.collective_rpc(h.kv_cache_shape)
        heads = llm.collective_rpc(lambda w: w.get_model().model.layers[0].self_attn.attn.num_heads)
    finally:
        llm.shutdown()
    assert shapes[0] == shapes[1] == (64, 8, 1, 16 + 8)  # the whole latent on each rank
    assert heads == [2, 2]  # 4 heads split


TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@torch.no_grad()
def test_openai_chat_with_the_checkpoints_template_matches_transformers(v3_dir, tmp_path, make_engine, openai_client):
    """The server renders the checkpoint's own chat template; the reply is transformers' greedy text."""
    import json
    import shutil

    ckpt = tmp_path / "deepseek-v3-chat"
    shutil.copytree(v3_dir, ckpt)
    tok_config = json.loads((ckpt / "tokenizer_config.json").read_text())
    (ckpt / "tokenizer_config.json").write_text(json.dumps({**tok_config, "chat_template": TEMPLATE}))
    server = make_engine(ckpt).start_server()
    client = openai_client(server)
    messages = [{"role": "user", "content": "def add(a, b):"}]
    chat = client.chat.completions.create(model=server.model_name, messages=messages, max_tokens=8, temperature=0)

    tokenizer = server.harness.engine.tokenizer
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tokenizer.decode(ids).endswith("<|assistant|>\n")
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager").eval()
    for _ in range(8):  # greedy, one token at a time (transformers' generate would stop at eos)
        ids = ids + [int(hf(input_ids=torch.tensor([ids])).logits[0, -1].argmax())]
    expected = tokenizer.decode(ids[-8:], skip_special_tokens=True)
    assert chat.choices[0].message.content == expected
    assert chat.usage.completion_tokens == 8


def test_pipeline_parallel_stages_match_one_stage(v3_dir):
    """pp=2: the dense layer on one stage, the MoE layer on the other, each with its latent cache."""
    llm = LLM(model=str(v3_dir), pipeline_parallel_size=2, **h.LLM_KWARGS)
    try:
        h.assert_same_outputs(h.reference(v3_dir), h.generate(llm))
    finally:
        llm.shutdown()


# ---- the routers against transformers' -------------------------------------------------


@pytest.mark.parametrize(
    "which, overrides",
    [
        ("v3", {}),
        ("v3", {"norm_topk_prob": False, "n_group": 1, "topk_group": 1}),
        ("v2", {}),
        ("v2", {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2, "routed_scaling_factor": 1.5}),
    ],
)
@torch.no_grad()
def test_router_picks_transformers_experts_and_weights(which, overrides):
    """Same weights (and V3's correction bias, large enough to change the choice) -> the same
    experts and routing weights as transformers' router, on 64 random tokens."""
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    from minivllm.models.deepseek_v2 import DeepseekRouter

    config = (deepseek_v3_config if which == "v3" else deepseek_v2_config)(**overrides)
    gen = torch.Generator().manual_seed(0)
    ref = (DeepseekV3TopkRouter if which == "v3" else DeepseekV2TopkRouter)(config)
    ref.weight.copy_(torch.randn(ref.weight.shape, generator=gen))
    ours = DeepseekRouter(config)
    ours.weight.copy_(ref.weight)
    if which == "v3":
        ref.e_score_correction_bias.copy_(0.5 * torch.randn(8, generator=gen))
        ours.e_score_correction_bias.copy_(ref.e_score_correction_bias)
    hidden = torch.randn(64, config.hidden_size, generator=gen)
    _, ref_weights, ref_ids = ref(hidden)
    weights, ids = ours(hidden)
    order, ref_order = ids.argsort(dim=1), ref_ids.argsort(dim=1)
    assert torch.equal(ids.gather(1, order), ref_ids.gather(1, ref_order))
    torch.testing.assert_close(weights.gather(1, order), ref_weights.gather(1, ref_order))
    if which == "v3" and config.n_group > 1:  # the bias moved some choice (else it would test nothing)
        ours.e_score_correction_bias.zero_()
        unbiased_ids = ours(hidden)[1]
        assert not torch.equal(unbiased_ids.sort(dim=1).values, ids.sort(dim=1).values)


def test_ngram_speculation_verifies_drafts_against_the_latent_cache(v3_dir):
    """Verify steps give each request several queries at once (expanded form, not a prefill);
    rejected drafts' latents are overwritten. Drafts are made only for requests without logprobs,
    and one-token lookups find matches in a random model's output. The tokens equal transformers'
    greedy ones."""
    prompts = [p * 3 for p in _prompts()]
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    llm = LLM(
        model=str(v3_dir),
        dtype="float32",
        block_size=8,
        num_gpu_blocks_override=64,
        max_model_len=128,
        speculative_config=spec,
    )
    try:
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        stats = llm.llm_engine.scheduler_stats()
    finally:
        llm.shutdown()
    assert stats.spec_num_draft_tokens > 0
    assert_greedy_tokens(v3_dir, prompts, [list(o.outputs[0].token_ids) for o in outs])


@torch.no_grad()
def assert_greedy_tokens(ckpt, prompts: list[list[int]], outputs: list[list[int]]) -> None:
    """transformers' argmax at every generated position is the token we chose."""
    hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager").eval()
    for prompt, tokens in zip(prompts, outputs, strict=True):
        logits = hf(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        assert logits.argmax(dim=-1).tolist() == tokens, f"greedy tokens differ for a {len(prompt)}-token prompt"

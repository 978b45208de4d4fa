"""task=bench end to end on a tiny checkpoint: metrics.json, preemptions, the transformers baseline."""

from __future__ import annotations

import json

import pytest
import torch

from minivllm.bench.hf_baseline import generate_batch, shared_checkpoint
from minivllm.bench.run import format_report
from minivllm.bench.workloads import build_workload, rehearsal_requests
from minivllm.cli.main import run
from minivllm.config.store import build_config, compose
from minivllm.entrypoints.llm import LLM

SMALL = [
    "task=bench",
    "bench.num_prompts=5",
    "bench.min_input_len=4",
    "bench.max_input_len=20",
    "bench.min_output_len=3",
    "bench.max_output_len=9",
    "bench.single_input_len=8",
    "bench.single_output_len=6",
    "bench.progress=false",
    "cache.block_size=8",
]


def _overrides(ckpt, *extra):
    return [f"model.path={ckpt}", *SMALL, *extra]


def test_bench_presets_compose():
    full = build_config(["model=qwen3-0.6b", "load.format=dummy", "task=bench", "bench=nanovllm"])
    nano = full.bench
    assert (nano.num_prompts, nano.min_input_len, nano.max_input_len) == (256, 100, 1024)
    assert (nano.min_output_len, nano.max_output_len, nano.workload) == (100, 1024, "random")
    # A global preset: the engine settings of nano-vllm's run come with the workload...
    assert (full.scheduler.max_num_seqs, full.scheduler.max_num_batched_tokens) == (512, 16384)
    assert (full.max_model_len, full.cache.block_size) == (4096, 256)
    # ...and the command line still wins.
    assert compose(["bench=nanovllm", "cache.block_size=32"]).cache.block_size == 32
    shared = compose(["bench=shared_prefix"]).bench
    assert shared.workload == "shared_prefix" and shared.num_prefixes == 4
    with pytest.raises(ValueError, match="bench.baseline='tgi'"):
        build_config(["model=opt-125m", "load.format=dummy", "bench.baseline=tgi"])


def test_bench_writes_complete_metrics(opt_dir, tmp_path):
    cfg = compose(_overrides(opt_dir, "cache.num_gpu_blocks_override=64"))
    returned = run(cfg, tmp_path)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics == json.loads(json.dumps(returned))
    vcfg = build_config(_overrides(opt_dir))
    expected = build_workload(vcfg.bench, vcfg.hf_config.vocab_size, vcfg.max_model_len)
    assert metrics["status"] == "ok"
    assert metrics["num_requests"] == 5
    assert metrics["input_tokens"] == sum(len(r.prompt_token_ids) for r in expected)
    assert metrics["output_tokens"] == metrics["requested_output_tokens"] == sum(r.max_tokens for r in expected)
    seconds = metrics["total_time_s"]
    assert seconds > 0 and metrics["cpu_time_s"] > 0
    assert metrics["output_tokens_per_s"] == pytest.approx(metrics["output_tokens"] / seconds)
    assert metrics["input_tokens_per_s"] == pytest.approx(metrics["input_tokens"] / seconds)
    assert metrics["requests_per_s"] == pytest.approx(5 / seconds)
    assert (metrics["num_kv_blocks"], metrics["block_size"], metrics["num_preemptions"]) == (64, 8, 0)
    assert 0 < metrics["peak_memory_gib"] < 64
    engine = metrics["engine"]
    assert engine["step_time_s"] <= seconds
    assert 0 <= engine["model_time_s"] <= engine["step_time_s"]
    assert engine["overhead_s"] == pytest.approx(engine["step_time_s"] - engine["model_time_s"])
    single = metrics["single_request"]
    assert (single["input_len"], single["output_len"]) == (8, 6)
    assert single["decode_tokens_per_s"] > 0 and single["overhead_ms_per_step"] >= 0
    roof = metrics["roofline"]
    assert roof["copy_bandwidth_gb_s"] > 0 and roof["kv_bytes_per_token"] == 2 * 2 * 64 * 4  # 2 layers, K+V, fp32
    assert 0 < roof["achieved_fraction"] < 1
    assert "baseline" not in metrics


@pytest.mark.parametrize("budget, blocks, expected", [(64, 64, 64), (2048, 64, 256)])
def test_warm_up_runs_a_step_at_the_full_token_budget(opt_dir, tmp_path, budget, blocks, expected):
    """The timed run's first steps are full-budget prefills over many sequences; the warm-up
    runs one (capped at half the KV cache, here 64 blocks of 8 tokens) so their one-time
    costs (kernel compiles) stay out of the timings."""
    extra = [
        f"scheduler.max_num_batched_tokens={budget}",
        f"cache.num_gpu_blocks_override={blocks}",
        "bench.single_request=false",
        "bench.num_prompts=2",
    ]
    metrics = run(compose(_overrides(opt_dir, *extra)), tmp_path)
    assert expected <= metrics["warmup_max_step_tokens"] <= min(budget, expected + 20)
    assert metrics["num_preemptions"] == 0 and metrics["output_tokens"] == metrics["requested_output_tokens"]


def test_bench_counts_preemptions_and_still_generates_every_token(opt_dir, tmp_path):
    # 6 blocks of 8 tokens cannot hold five requests of up to 36 tokens at once
    small_cache = ["cache.num_gpu_blocks_override=6", "bench.min_output_len=9", "bench.max_output_len=16"]
    metrics = run(compose(_overrides(opt_dir, *small_cache, "bench.single_request=false")), tmp_path)
    assert metrics["num_preemptions"] > 0
    assert metrics["output_tokens"] == metrics["requested_output_tokens"]


def test_hf_baseline_runs_the_same_requests(opt_dir, tmp_path):
    metrics = run(
        compose(_overrides(opt_dir, "cache.num_gpu_blocks_override=64", "bench.baseline=hf", "bench.hf_batch_size=2")),
        tmp_path,
    )
    base = metrics["baseline"]
    assert base["name"] == "transformers" and base["batch_size"] == 2
    assert base["output_tokens"] == metrics["requested_output_tokens"]
    # 3 static batches of 2, 2 and 1 requests, each padded to its longest max_tokens
    assert base["generated_tokens_incl_padding"] >= base["output_tokens"]
    assert base["output_tokens_per_s"] == pytest.approx(base["output_tokens"] / base["total_time_s"])
    assert metrics["speedup_output_tokens_per_s"] == pytest.approx(
        metrics["output_tokens_per_s"] / base["output_tokens_per_s"]
    )
    assert metrics["speedup_cpu_time"] == pytest.approx(base["cpu_time_s"] / metrics["cpu_time_s"])
    single = metrics["single_request"]
    assert single["hf_decode_tokens_per_s"] > 0
    assert single["decode_speedup"] == pytest.approx(single["decode_tokens_per_s"] / single["hf_decode_tokens_per_s"])


def test_left_padded_batch_generates_what_each_prompt_generates_alone(opt_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(opt_dir), dtype=torch.float32).eval()
    long, short = list(range(5, 25)), list(range(30, 36))
    both = generate_batch(model, [long, short], 7, temperature=0.0)
    assert both.shape == (2, 7)
    assert torch.equal(both[1], generate_batch(model, [short], 7, temperature=0.0)[0])
    assert torch.equal(both[0], generate_batch(model, [long], 7, temperature=0.0)[0])


def test_dummy_weights_are_shared_with_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    shape = dict(
        num_hidden_layers=1, hidden_size=32, ffn_dim=64, num_attention_heads=2, word_embed_proj_dim=32, vocab_size=300
    )
    overrides = ["model=opt-125m", "load.format=dummy", "cache.num_gpu_blocks_override=8"]
    overrides += [f"model.hf_config.{k}={v}" for k, v in shape.items()]
    cfg = shared_checkpoint(build_config(overrides), tmp_path)
    assert cfg.load.format == "auto" and cfg.checkpoint_dir == tmp_path and cfg.dtype == torch.float32
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    llm = LLM.from_config(cfg)
    try:
        ours = llm.llm_engine.core.executor.worker.model_runner.model
        decoder = ours.model.decoder
        assert torch.equal(decoder.embed_tokens.weight, hf.model.decoder.embed_tokens.weight)
        assert torch.equal(decoder.layers[0].fc1.weight, hf.model.decoder.layers[0].fc1.weight)
        hf_qkv = [getattr(hf.model.decoder.layers[0].self_attn, f"{n}_proj").weight for n in "qkv"]
        assert torch.equal(decoder.layers[0].self_attn.qkv_proj.weight, torch.cat(hf_qkv))
    finally:
        llm.shutdown()


def test_bench_offload_multi_turn_alternates_and_hits_host_memory(opt_dir, tmp_path):
    """bench=offload over a device cache smaller than the chats: the runs with the host tier
    load prefixes from it (host hits), the runs without find none, every run the same tokens."""
    cfg = compose(
        [
            f"model.path={opt_dir}",
            "task=bench",
            "bench=offload",
            "bench.num_prompts=3",
            "bench.turns=2",
            "bench.prefix_len=40",
            "bench.min_input_len=8",
            "bench.max_input_len=8",
            "bench.max_output_len=4",
            "bench.min_output_len=4",
            "cache.block_size=8",
            "cache.num_gpu_blocks_override=12",
            "cache.kv_offloading_size=0.01",
        ]
    )
    metrics = run(cfg, tmp_path)
    assert json.loads((tmp_path / "metrics.json").read_text()) == json.loads(json.dumps(metrics))
    runs = metrics["runs"]
    assert [r["offload_gib"] for r in runs] == [0, 0.01, 0.01, 0]
    assert metrics["identical_outputs"] is True
    assert all(r["host_hit_tokens"] > 0 for r in runs[1:3]) and all(r["host_hit_tokens"] == 0 for r in runs[::3])
    assert runs[1]["computed_prompt_tokens"] < runs[0]["computed_prompt_tokens"]


def test_bench_disagg_runs_one_engine_and_prefill_plus_decode(opt_dir, tmp_path):
    """bench=disagg: the prefill + decode runs pull every prompt's blocks and deliver every
    requested token, as the one-engine runs do."""
    cfg = compose(
        [
            f"model.path={opt_dir}",
            "task=bench",
            "bench=disagg",
            "bench.num_prompts=2",
            "bench.num_long_prompts=2",
            "bench.long_prompt_len=40",
            "bench.max_output_len=6",
            "bench.min_output_len=3",
            "bench.request_rate=50",
            "cache.block_size=8",
        ]
    )
    metrics = run(cfg, tmp_path)
    runs = metrics["runs"]
    assert [r["setup"] for r in runs] == ["one engine", "prefill + decode", "prefill + decode", "one engine"]
    assert [r["all"]["output_tokens"] for r in runs] == [2 * 6 + 2 * 3] * 4
    assert all(r["pulled_prompt_tokens"] >= 2 * 40 // 8 * 8 - 16 for r in runs[1:3])  # the long prompts' blocks
    assert runs[0]["pulled_prompt_tokens"] == runs[3]["pulled_prompt_tokens"] == 0


def test_the_cpu_warm_up_rehearses_the_timed_requests(opt_dir):
    """On the CPU the warm-up runs the timed requests' shapes: the same lengths and shared prefixes
    under other token ids, so no timed prompt finds them in the prefix cache."""
    cfg = build_config(_overrides(opt_dir, "bench=shared_prefix", "bench.num_prompts=6", "bench.prefix_len=10"))
    timed = build_workload(cfg.bench, cfg.hf_config.vocab_size, cfg.max_model_len)
    rehearsal = rehearsal_requests(cfg, timed)
    assert [(len(r.prompt_token_ids), r.max_tokens) for r in rehearsal] == [
        (len(t.prompt_token_ids), t.max_tokens) for t in timed
    ]

    def agree(reqs, i, j):
        return [x == y for x, y in zip(reqs[i].prompt_token_ids, reqs[j].prompt_token_ids)]

    pairs = [(i, j) for i in range(len(timed)) for j in range(i + 1, len(timed))]
    assert all(agree(rehearsal, i, j) == agree(timed, i, j) for i, j in pairs)  # the same prefixes shared
    assert any(all(agree(timed, i, j)[:10]) for i, j in pairs)  # the workload does share some
    timed_prefixes = {tuple(t.prompt_token_ids[:4]) for t in timed}
    assert not any(tuple(r.prompt_token_ids[:4]) in timed_prefixes for r in rehearsal)
    assert rehearsal_requests(build_config(_overrides(opt_dir, "bench.warmup=false")), timed) is None


def test_the_cpu_bench_reports_its_warm_up_apart(opt_dir, tmp_path):
    metrics = run(compose(_overrides(opt_dir, "cache.num_gpu_blocks_override=64")), tmp_path)
    warm = metrics["warmup"]
    assert warm["rehearsed_requests"] == 5 and warm["time_s"] > 0 and warm["cpu_time_s"] > 0
    assert "warm-up (untimed)" in format_report(metrics) and "5 requests" in format_report(metrics)
    assert "warmup" not in run(compose(_overrides(opt_dir, "bench.warmup=false")), tmp_path / "cold")

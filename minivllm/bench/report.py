"""The human-readable report of one benchmark run (metrics.json holds the same numbers)."""

from __future__ import annotations

from typing import Any


def _num(value: Any, fmt: str = ".1f") -> str:
    return "n/a" if value is None else format(value, fmt)


def format_report(m: dict[str, Any]) -> str:
    lines = [
        f"== minivllm bench: {m['model']} ({m['architecture']}) on {m['device']}, {m['dtype']}, "
        f"{m['attention_backend']}",
        f"workload {m['workload']}: {m['num_requests']} requests, {m['input_tokens']} prompt tokens, "
        f"{m['requested_output_tokens']} output tokens",
        f"{'':18}{'req/s':>9}{'in tok/s':>11}{'out tok/s':>11}{'time s':>9}{'cpu s':>9}",
        _row("minivllm", m),
    ]
    base = m.get("baseline")
    if base:
        lines.append(_row(f"{base['name']} bs={base['batch_size']}", base))
        lines.append(
            f"speedup: {_num(m.get('speedup_output_tokens_per_s'), '.2f')}x output tok/s, "
            f"{_num(m.get('speedup_cpu_time'), '.2f')}x CPU time"
        )
    lines.append(
        f"KV blocks {m['num_kv_blocks']} x {m['block_size']} tokens, preemptions {m['num_preemptions']}, "
        f"peak memory {_num(m['peak_memory_gib'], '.2f')} GiB"
    )
    if "ttft_p99_ms" in m:  # bench.mode=serving
        lines.append(
            f"arrivals at {m['request_rate']} req/s; latency ms p50/p99: TTFT {_num(m['ttft_p50_ms'])}/"
            f"{_num(m['ttft_p99_ms'])}, ITL {_num(m['itl_p50_ms'])}/{_num(m['itl_p99_ms'])}, "
            f"E2E {_num(m['e2e_p50_ms'])}/{_num(m['e2e_p99_ms'])}"
        )
    eng = m.get("engine") or {}
    if "images_per_s" in m:  # bench.workload=images
        lines.append(
            f"images: {m['images']} sent, {m.get('images_encoded')} encoded in {m.get('encoder_calls')} encoder calls, "
            f"{_num(m['images_per_s'], '.2f')} images/s; "
            f"vision encoder {_num(eng.get('encoder_time_s'), '.2f')} s, "
            f"{_num(_pct(eng.get('encoder_fraction')))}% of step time"
        )
    if eng:
        lines.append(
            f"engine: {eng.get('num_steps')} steps ({eng.get('num_prefill_steps')} with prefill: "
            f"{_num(eng.get('prefill_step_time_s'), '.2f')} s), overhead {_num(eng.get('overhead_per_step_ms'), '.2f')} "
            f"ms/step ({_num(_pct(eng.get('overhead_fraction')))}% of step time)"
        )
    single = m.get("single_request")
    if single:
        line = (
            f"single request ({single['input_len']} in, {single['output_len']} out): decode "
            f"{_num(single['decode_tokens_per_s'])} tok/s, median step {_num(single['decode_step_ms'], '.2f')} ms "
            f"(model {_num(single['model_ms_per_step'], '.2f')}, overhead {_num(single['overhead_ms_per_step'], '.2f')})"
        )
        if "hf_decode_tokens_per_s" in single:
            line += (
                f"; transformers {_num(single['hf_decode_tokens_per_s'])} tok/s "
                f"({_num(single['decode_speedup'], '.2f')}x)"
            )
        lines.append(line)
    roof = m.get("roofline")
    if roof:
        lines.append(
            f"roofline ({roof['device']}, copy bandwidth {_num(roof['copy_bandwidth_gb_s'])} GB/s): floor "
            f"{_num(roof['floor_s'], '.2f')} s of {_num(roof['measured_s'], '.2f')} s -> "
            f"{_num(_pct(roof['achieved_fraction']))}% (decode steps {_num(_pct(roof['decode_achieved_fraction']))}%)"
        )
    return "\n".join(lines)


def _row(name: str, m: dict[str, Any]) -> str:
    return (
        f"{name:18}{_num(m['requests_per_s'], '.2f'):>9}{_num(m['input_tokens_per_s']):>11}"
        f"{_num(m['output_tokens_per_s']):>11}{_num(m['total_time_s'], '.2f'):>9}{_num(m.get('cpu_time_s'), '.2f'):>9}"
    )


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else 100 * fraction

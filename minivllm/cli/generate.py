"""task=generate: run the configured prompts and write outputs.jsonl and metrics.json."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from minivllm.config.vllm_config import VllmConfig
from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import SamplingParams


def load_prompts(cfg: VllmConfig) -> list[str]:
    if not cfg.prompts_file:
        return list(cfg.prompts)
    path = Path(cfg.prompts_file).expanduser()
    if not path.is_file():
        raise ValueError(f"prompts_file={cfg.prompts_file!r}: no such file")
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if path.suffix == ".jsonl":
        return [json.loads(line)["prompt"] for line in lines]
    return lines


def sampling_params(cfg: VllmConfig) -> SamplingParams:
    fields = dict(cfg.sampling)
    try:
        return SamplingParams(**fields)
    except TypeError as err:  # an unknown field name
        raise ValueError(f"sampling: {err}; see SamplingParams for the fields") from None


def run_generate(cfg: VllmConfig, out_dir: Path) -> dict[str, Any]:
    prompts = load_prompts(cfg)
    params = sampling_params(cfg)
    llm = LLM.from_config(cfg)
    try:
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        stats = llm.llm_engine.scheduler_stats()
    finally:
        llm.shutdown()
    with open(out_dir / "outputs.jsonl", "w") as f:
        for out in outputs:
            for c in out.outputs:  # sampling.n completions per prompt
                print(f"\n>>> {out.prompt!r}\n{out.prompt}{c.text}")
                record = {"prompt": out.prompt, "text": c.text, "token_ids": c.token_ids}
                record["finish_reason"] = c.finish_reason
                if len(out.outputs) > 1:
                    record["index"] = c.index
                f.write(json.dumps(record) + "\n")
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    metrics = {
        "num_requests": len(outputs),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "seconds": seconds,
        "output_tokens_per_s": output_tokens / seconds,
        "total_tokens_per_s": (prompt_tokens + output_tokens) / seconds,
        "num_kv_blocks": stats.num_blocks,
        "block_size": cfg.cache.block_size,
        "num_preemptions": stats.num_preemptions,
    }
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    print(
        f"\n{len(outputs)} requests, {output_tokens} tokens in {seconds:.2f} s "
        f"({metrics['output_tokens_per_s']:.1f} tok/s); KV blocks {stats.num_blocks}, "
        f"preemptions {stats.num_preemptions}; results in {out_dir}"
    )
    return metrics

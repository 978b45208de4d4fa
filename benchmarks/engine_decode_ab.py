"""The bench workload through one engine, alternating the torch backend's decode path.

    python benchmarks/engine_decode_ab.py model.path=/path/to/hf_dir [bench.num_prompts=32 ...] [--rounds 2]

``slot gather``: the decode path before whole-block gathers and length groups (every
request padded to the longest, K/V gathered slot by slot). ``current``: the backend as
it is. Rounds alternate the two on the same engine, so a shared machine's changing
load hits both alike. Overrides are the CLI's (task=bench is implied).
"""
from __future__ import annotations

import argparse

import torch

from minivllm.attention import torch_backend as tb
from minivllm.bench.run import _drive, _model_runner, _workload
from minivllm.bench.step_timer import StepTimer
from minivllm.config.store import build_config
from minivllm.entrypoints.llm import LLM


def slot_gather_decode(self, query, kv_cache, meta, idx, out, *, scale, sliding_window, soft_cap) -> None:
    rows = torch.tensor(idx, device=query.device)
    token_idx = meta.query_start_loc[rows].long()
    seq_lens = meta.seq_lens[rows].long()
    max_len = max(meta.seq_lens_cpu[i] for i in idx)
    k, v = tb._gather(kv_cache, tb.gather_slots(meta.block_tables[rows], max_len, kv_cache.shape[2]))
    mask = torch.arange(max_len, device=query.device) < seq_lens[:, None]
    if sliding_window is not None:
        mask &= torch.arange(max_len, device=query.device) > (seq_lens[:, None] - 1 - sliding_window)
    o = tb._attend(query[token_idx].unsqueeze(2), k, v, mask[:, None, None, :], scale, soft_cap)
    out[token_idx] = o.squeeze(2).to(out.dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    cfg = build_config(["task=bench", "bench.progress=false", *args.overrides])
    requests, _ = _workload(cfg)
    llm = LLM.from_config(cfg)
    timer = StepTimer(llm.llm_engine.core.executor, _model_runner(llm), torch.device(cfg.device_type))
    current = tb.TorchAttentionBackend._decode
    variants = {"slot gather": slot_gather_decode, "current": current}
    results: dict[str, list[float]] = {name: [] for name in variants}
    try:
        _drive(llm, requests[:2], cfg, timer, None)  # warm-up
        for _ in range(args.rounds):
            for name, decode in variants.items():
                tb.TorchAttentionBackend._decode = decode
                seconds, tokens, cpu = _drive(llm, requests, cfg, timer, None)
                results[name].append(tokens / seconds)
                print(f"{name:12} {tokens} tokens in {seconds:6.2f} s ({cpu:6.2f} s CPU): {tokens / seconds:6.1f} output tok/s")
    finally:
        tb.TorchAttentionBackend._decode = current
        llm.shutdown()
    print(f"torch threads {torch.get_num_threads()}; best of {args.rounds} rounds (output tok/s):")
    for name, values in results.items():
        print(f"  {name:12} {max(values):6.1f}")


if __name__ == "__main__":
    main()

"""A tuning run's best.yaml against the default engine keys, on the same serving workload.

    python benchmarks/tune_vs_default.py outputs/multirun/.../best.yaml --rounds 2 bench.request_rate=24

Both configs run the same bench=serving replay in this process, alternating
(default, tuned, default, tuned, ...) so that a machine whose load changes treats
them alike; prints each round and the median of each config's output tokens/s and
p99 TTFT / ITL / E2E. The default config is best.yaml with every tuned key set back
to its default (the model and any other key given to the tuning run stay).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from omegaconf import OmegaConf

from minivllm.bench.run import bench_serving
from minivllm.bench.workloads import build_workload
from minivllm.config.store import build_config
from minivllm.tune import load_tuned

METRICS = ("output_tokens_per_s", "ttft_p99_ms", "itl_p99_ms", "e2e_p99_ms")


def tuned_keys(best: Path) -> list[str]:
    """The dotted keys best.yaml sets below the engine sections (scheduler.max_num_seqs, ...)."""
    body = OmegaConf.load(best)
    keys = []
    for section in ("scheduler", "cache", "compilation"):
        node = body.get(section) or {}
        keys += [f"{section}.{k}" for k in node]
    return keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("best", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for both configs (the workload)")
    args = parser.parse_intermixed_args()
    serving = ["task=bench", "bench=serving", "bench.progress=false", *args.overrides]
    defaults = build_config().to_dictconfig()
    reset = []
    for key in tuned_keys(args.best):
        value = OmegaConf.select(defaults, key)
        reset.append(f"{key}={'null' if value is None else value}")
    configs = {
        "default": load_tuned(args.best, [*serving, *reset]),
        "tuned": load_tuned(args.best, serving),
    }
    results: dict[str, list[dict]] = {name: [] for name in configs}
    for round_ in range(args.rounds):
        for name, cfg in configs.items():
            requests = build_workload(cfg.bench, cfg.hf_config.vocab_size, cfg.max_model_len)
            m = bench_serving(cfg, requests)
            results[name].append(m)
            print(f"round {round_} {name:8}" + "".join(f"  {k} {m[k]:.1f}" for k in METRICS), flush=True)
    print("\n| config | " + " | ".join(METRICS) + " |\n|---|" + "---|" * len(METRICS))
    for name, runs in results.items():
        print(f"| {name} | " + " | ".join(f"{statistics.median(r[k] for r in runs):.1f}" for k in METRICS) + " |")
    print(
        "\ntuned keys: "
        + ", ".join(f"{k}={OmegaConf.select(configs['tuned'].to_dictconfig(), k)}" for k in tuned_keys(args.best))
    )


if __name__ == "__main__":
    main()

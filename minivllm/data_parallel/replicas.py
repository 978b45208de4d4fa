"""Starting the data-parallel replicas (one engine process each) and merging what they report."""
from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Callable

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.stats import SchedulerStats
from minivllm.engine.engine_client import EngineClient
from minivllm.engine.engine_proc import EngineMessage

OnMessage = Callable[[int, EngineMessage, float], None]
"""``(replica, message, arrival_time)``, called on the replica's reader thread."""
OnExit = Callable[[int, str], None]
"""``(replica, reason)``, called when the replica's engine process has exited."""


def replica_config(cfg: VllmConfig, replica: int) -> VllmConfig:
    """``cfg`` for replica ``replica``: the same engine, its own ``parallel.dp_rank`` (its devices)."""
    if cfg.parallel.dp == 1:
        return cfg
    own = copy.deepcopy(cfg)
    own.parallel.dp_rank = replica
    return own


def start_engines(cfg: VllmConfig, on_message: OnMessage, on_exit: OnExit) -> list[EngineClient]:
    """One engine process per replica, started together; returns once every model is loaded.

    If one fails to start, the others are stopped and its error is raised
    (a ValueError, a bad config, as is; a crash naming the replica).
    """
    dp = cfg.parallel.dp

    def start(replica: int) -> EngineClient:
        return EngineClient(replica_config(cfg, replica), partial(on_message, replica), partial(on_exit, replica))

    if dp == 1:
        return [start(0)]
    with ThreadPoolExecutor(max_workers=dp, thread_name_prefix="minivllm-dp-start") as pool:
        futures = [pool.submit(start, r) for r in range(dp)]
    started = [f.result() for f in futures if f.exception() is None]
    failed = [(r, f.exception()) for r, f in enumerate(futures) if f.exception() is not None]
    if failed:
        for client in started:
            client.shutdown()
        replica, err = failed[0]
        if isinstance(err, ValueError):
            raise err
        raise RuntimeError(f"data-parallel replica {replica}: {err}") from err
    return started


def merge_stats(stats: list[SchedulerStats]) -> SchedulerStats:
    """The replicas' scheduler stats as one engine's: counts add up; KV usage is over all blocks."""
    if len(stats) == 1:
        return stats[0]
    total = SchedulerStats(
        **{name: sum(getattr(s, name) for s in stats) for name in _COUNTS},
    )
    used = sum(s.num_blocks - s.num_free_blocks for s in stats)
    total.kv_cache_usage = used / total.num_blocks if total.num_blocks else 0.0
    total.spec_decoding = any(s.spec_decoding for s in stats)
    return total


_COUNTS = (
    "num_running",
    "num_waiting",
    "num_preemptions",
    "num_free_blocks",
    "num_blocks",
    "num_preempted",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "spec_num_drafts",
    "spec_num_draft_tokens",
    "spec_num_accepted_tokens",
)

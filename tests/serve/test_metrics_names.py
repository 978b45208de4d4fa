"""/metrics and ``LLM.get_metrics()`` names: vLLM's by default, under a configurable prefix.

The oracle is the list of names vLLM's v1 Prometheus stat logger declares
(``vllm/v1/metrics/loggers.py``), for the quantities we export too.
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from minivllm.config.task import ServeConfig
from minivllm.core.stats import SchedulerStats
from minivllm.engine.stats import StatLogger, engine_metrics
from minivllm.serve.metrics import ServerMetrics

VLLM_SERVER_NAMES = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits",
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
}
"""Source-literal names; prometheus_client adds ``_total`` to a counter's samples."""


def served_names(prefix: str) -> set[str]:
    text = ServerMetrics("m", prefix).render(SchedulerStats()).decode()
    return {family.name for family in text_string_to_metric_families(text)}


def offline_names(prefix: str) -> set[str]:
    stats = StatLogger(interval_s=5.0).snapshot(SchedulerStats())
    return {metric.name for metric in engine_metrics(stats, 0, "m", prefix)}


def test_default_names_are_vllms_on_the_server_and_offline():
    prefix = ServeConfig().metrics_prefix
    assert VLLM_SERVER_NAMES <= served_names(prefix)
    assert offline_names(prefix) <= VLLM_SERVER_NAMES


def test_the_prefix_renames_every_metric_on_the_server_and_offline():
    for names in (served_names("team:llm"), offline_names("team:llm")):
        assert names and all(name.startswith("team:llm:") for name in names)
    assert {n.removeprefix("team:llm:") for n in served_names("team:llm")} == {
        n.removeprefix("vllm:") for n in served_names("vllm")
    }


@pytest.mark.parametrize("prefix", ["", "1team", "my-team", "a b", "vllm/"])
def test_a_prefix_prometheus_cannot_name_is_refused(prefix):
    with pytest.raises(ValueError, match="serve.metrics_prefix"):
        ServeConfig(metrics_prefix=prefix)

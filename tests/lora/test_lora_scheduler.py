"""The scheduler runs at most ``lora.max_loras`` distinct adapters at once; others wait their turn."""

from __future__ import annotations

import copy

from minivllm.core.scheduler import Scheduler
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.lora import LoRARequest
from minivllm.outputs import ModelRunnerOutput
from tests.core.scheduler_helpers import base_config, make_request


def test_at_most_max_loras_adapters_run_and_the_rest_wait():
    cfg = copy.deepcopy(base_config())
    cfg.lora.enable_lora, cfg.lora.max_loras = True, 2
    sched = Scheduler(cfg, KVCacheSpec(cfg.cache.block_size, num_blocks=64))
    adapters = [1, 2, 1, 3, None, 2]  # request i runs under adapter adapters[i]
    for i, lid in enumerate(adapters):
        request = make_request(range(10, 18), max_tokens=2, req_id=f"r{i}")
        request.lora_request = None if lid is None else LoRARequest(f"a{lid}", lid, "/unused")
        sched.add_request(request)
    seen_adapter_3, first = False, True
    while sched.has_unfinished_requests():
        out = sched.schedule()
        running = {sched.requests[r].lora_int_id for r in out.num_scheduled_tokens} - {None}
        assert len(running) <= 2
        if first:  # adapters 1 and 2 (and the base model) pass the request of adapter 3
            assert set(out.num_scheduled_tokens) == {"r0", "r1", "r2", "r4", "r5"}
            first = False
        seen_adapter_3 |= 3 in running
        done = {
            r: [7]
            for r, n in out.num_scheduled_tokens.items()
            if sched.requests[r].num_computed_tokens == sched.requests[r].num_tokens
        }
        sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids=done))
    assert seen_adapter_3


def test_lora_id_changes_the_block_hashes():
    from minivllm.core.block_hash import request_extra_keys

    assert request_extra_keys(None, 1) != request_extra_keys(None, 2) != request_extra_keys(None)
    assert request_extra_keys("s", None) == (("cache_salt", "s"),)

"""A KV load that fails after the scheduler committed to it (a shared-storage file removed or
cut short, a producer engine gone before or during a pull) costs time, never tokens: the
worker reports the blocks that did not load, the scheduler rolls the request back to its last
good block and recomputes the rest. The oracle is one engine computing everything."""

from __future__ import annotations

import os

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.kv_transfer import KV_CONNECTORS, register_kv_connector
from minivllm.kv_transfer.p2p import P2pConnector
from minivllm.kv_transfer.shared_storage import SharedStorageConnector
from tests.kv_transfer.test_p2p import KWARGS, PROMPTS, consumer, decode_params, producer_process

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PREFILL = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
FAILED_BLOCK = 2
"""Which of a request's loaded blocks goes missing (the two before it load)."""


class BrokenStorage(SharedStorageConnector):
    """Shared storage whose file for a request's third loaded block is removed (or cut short)
    once the scheduler has committed to load it, before the worker reads it."""

    damage = "remove"

    def update_state_after_alloc(self, request, block_ids, num_computed_tokens, num_external_tokens):
        super().update_state_after_alloc(request, block_ids, num_computed_tokens, num_external_tokens)
        loads = self._loads.get(request.request_id)
        if loads and len(loads) > FAILED_BLOCK:
            path = self._file(loads[FAILED_BLOCK][1], 0)
            if BrokenStorage.damage == "remove":
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(path.read_bytes()[:10])


@pytest.fixture(scope="module")
def reference(llama_dir):
    torch.set_num_threads(1)
    return [o.outputs[0].token_ids for o in LLM(str(llama_dir), **KWARGS).generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.fixture
def broken_storage():
    register_kv_connector("BrokenStorage", BrokenStorage)
    yield BrokenStorage
    KV_CONNECTORS.pop("BrokenStorage")


def _storage_engine(llama_dir, path, connector, role, **kwargs):
    config = {
        "kv_connector": connector,
        "kv_role": role,
        "kv_connector_extra_config": {"shared_storage_path": str(path)},
    }
    return LLM(str(llama_dir), kv_transfer_config=config, **{**KWARGS, **kwargs})


@pytest.mark.parametrize(
    "damage, kwargs",
    [
        ("remove", {}),
        ("truncate", {}),
        ("remove", {"async_scheduling": True, "max_num_batched_tokens": 8}),
    ],
    ids=["removed", "cut-short", "removed-async-chunked"],
)
def test_a_shared_storage_file_gone_after_commit(llama_dir, tmp_path, reference, broken_storage, damage, kwargs):
    """The same prompt twice in one batch: the second hits the first's loaded blocks in the
    device cache in the same step, so both are rolled back."""
    broken_storage.damage = damage
    _storage_engine(llama_dir, tmp_path, "SharedStorageConnector", "kv_producer").generate(
        PROMPTS, PREFILL, use_tqdm=False
    )
    llm = _storage_engine(llama_dir, tmp_path, "BrokenStorage", "kv_consumer", **kwargs)
    outs = llm.generate([PROMPTS[0], PROMPTS[0], PROMPTS[1]], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [reference[0], reference[0], reference[1]]
    good = FAILED_BLOCK * 4  # the blocks before the missing one loaded and stay in the device cache
    assert outs[0].num_cached_tokens == outs[2].num_cached_tokens == good
    assert outs[1].num_cached_tokens >= good  # it may hit the first's recomputed blocks
    assert llm.llm_engine.scheduler_stats().external_prefix_cache_hits == 2 * good  # the failed tokens taken back
    assert llm.llm_engine.scheduler_stats().num_preemptions == 0  # a rollback is no preemption


class DyingProducer(P2pConnector):
    """A producer whose process exits after acknowledging a pull, before its bytes are sent."""

    def send_rows(self, group, rows):
        os._exit(1)


def test_a_producer_killed_mid_transfer(llama_dir, reference):
    with producer_process(llama_dir, PROMPTS, connector="DyingProducer") as (proc, _, params):
        cons = consumer(llama_dir, kv_transfer_config_extra={"transfer_timeout": 20})
        outs = cons.generate(PROMPTS, decode_params(params), use_tqdm=False)
        proc.join(30)
        assert proc.exitcode == 1  # it died in the first pull
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert [o.num_cached_tokens for o in outs] == [0, 0]
    assert cons.llm_engine.scheduler_stats().external_prefix_cache_hits == 0


def test_a_producer_gone_before_the_pull(llama_dir, reference):
    with producer_process(llama_dir, PROMPTS) as (proc, _, params):
        proc.kill()
        proc.join()
        outs = consumer(llama_dir).generate(PROMPTS, decode_params(params), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert [o.num_cached_tokens for o in outs] == [0, 0]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_tp2_one_rank_fails_the_other_loads(llama_dir, reference):
    """Producer rank 0 refuses the pulls, rank 1 serves its shard: the blocks count as failed
    on every rank (the union), and the consumer computes the prompts."""
    with producer_process(llama_dir, PROMPTS, drop_rank0=True, tensor_parallel_size=2) as (_, pipe, params):
        cons = consumer(llama_dir, tensor_parallel_size=2)
        try:
            outs = cons.generate(PROMPTS, decode_params(params), use_tqdm=False)
        finally:
            cons.shutdown()
        pipe.send("done")
        assert pipe.recv() == [0, 0]  # rank 1's copies were pulled
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert [o.num_cached_tokens for o in outs] == [0, 0]

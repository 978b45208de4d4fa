"""Disaggregated prefill point to point: a producer engine computes prompts (``max_tokens=1``)
and serves their KV; a consumer engine given the producer's ``kv_transfer_params`` pulls it
over a gloo group and decodes. The oracle is one engine doing both: outputs identical, with
the pulled prompt tokens not recomputed."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.config.store import build_config
from minivllm.distributed.utils import get_open_port
from minivllm.kv_transfer import register_kv_connector

PROMPTS = [
    "import os\nimport sys\n\nclass Config:\n    def __init__(self, path):\n        self.path = path\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
]
MAX_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
PREFILL = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
KWARGS = dict(dtype="float32", block_size=4, disable_log_stats=True, num_gpu_blocks_override=64, max_model_len=96)


def producer(llama_dir, port, connector="P2pConnector", **kwargs):
    config = {"kv_connector": connector, "kv_role": "kv_producer", "kv_port": port}
    return LLM(str(llama_dir), kv_transfer_config=config, **{**KWARGS, **kwargs})


def consumer(llama_dir, kv_transfer_config_extra=None, **kwargs):
    config = {"kv_connector": "P2pNcclConnector", "kv_role": "kv_consumer"}
    config["kv_connector_extra_config"] = kv_transfer_config_extra or {}
    return LLM(str(llama_dir), kv_transfer_config=config, **{**KWARGS, **kwargs})


def decode_params(prefilled):
    """The decode requests: each carries its prefill's kv_transfer_params (a RequestOutput's,
    or the dict), as the proxy sends them."""
    params = [o if isinstance(o, dict) else o.kv_transfer_params for o in prefilled]
    return [SamplingParams(**{**vars_of(GREEDY), "extra_args": {"kv_transfer_params": p}}) for p in params]


def num_staged(llm):
    """Per producer rank: requests whose KV waits to be pulled."""
    return llm.collective_rpc(lambda worker: worker.model_runner.kv_connector.num_staged())


def vars_of(params):
    return dict(temperature=params.temperature, max_tokens=params.max_tokens, ignore_eos=params.ignore_eos)


@pytest.fixture(scope="module")
def reference(llama_dir):
    torch.set_num_threads(1)
    return [o.outputs[0].token_ids for o in LLM(str(llama_dir), **KWARGS).generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_consumer_pulls_what_the_producer_computed(llama_dir, reference):
    port = get_open_port()
    prod = producer(llama_dir, port)
    prefilled = prod.generate(PROMPTS, PREFILL, use_tqdm=False)
    for out in prefilled:
        params = out.kv_transfer_params
        assert params["remote_port"] == port and params["remote_request_id"] == out.request_id
        assert len(params["remote_block_hashes"]) == len(out.prompt_token_ids) // 4
    assert num_staged(prod) == [2]
    cons = consumer(llama_dir)
    outs = cons.generate(PROMPTS, decode_params(prefilled), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference
    for out in outs:
        assert out.num_cached_tokens == (len(out.prompt_token_ids) - 1) // 4 * 4 > 0
        assert out.kv_transfer_params is None
    assert num_staged(prod) == [0]  # freed once pulled
    stats = cons.llm_engine.scheduler_stats()
    assert stats.external_prefix_cache_hits == sum(o.num_cached_tokens for o in outs)


def test_decode_side_prefix_cache_chunked_prefill_and_async_scheduling(llama_dir, reference):
    """The consumer holds the first blocks of a prompt in its own prefix cache: it pulls only
    the blocks after them, in a step whose token budget chunks what is left to compute."""
    tokenizer = LLM(str(llama_dir), **KWARGS).get_tokenizer()
    ids = tokenizer(PROMPTS[0])["input_ids"]
    prod = producer(llama_dir, get_open_port())
    prefilled = prod.generate({"prompt_token_ids": ids}, PREFILL, use_tqdm=False)
    cons = consumer(llama_dir, max_num_batched_tokens=8, async_scheduling=True)
    cons.generate({"prompt_token_ids": ids[:12]}, PREFILL, use_tqdm=False)  # 3 blocks now cached here
    out = cons.generate({"prompt_token_ids": ids}, decode_params(prefilled), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == reference[0]
    assert out.num_cached_tokens == (len(ids) - 1) // 4 * 4
    stats = cons.llm_engine.scheduler_stats()
    assert stats.external_prefix_cache_hits == out.num_cached_tokens - 12  # the device's 3 blocks not pulled
    assert num_staged(prod) == [0]


def test_a_partly_prefilled_prompt_pulls_its_prefilled_part_and_chunks_the_rest(llama_dir, reference):
    tokenizer = LLM(str(llama_dir), **KWARGS).get_tokenizer()
    ids = tokenizer(PROMPTS[0])["input_ids"]
    prod = producer(llama_dir, get_open_port())
    prefilled = prod.generate({"prompt_token_ids": ids[:20]}, PREFILL, use_tqdm=False)
    cons = consumer(llama_dir, max_num_batched_tokens=4)
    out = cons.generate({"prompt_token_ids": ids}, decode_params(prefilled), use_tqdm=False)[0]
    assert out.num_cached_tokens == 20
    assert out.outputs[0].token_ids == reference[0]


def test_params_for_another_prompt_are_not_loaded(llama_dir, reference):
    """The hashes differ from the first block: the consumer computes the prompt itself."""
    prod = producer(llama_dir, get_open_port())
    prefilled = prod.generate(PROMPTS[1], PREFILL, use_tqdm=False)
    cons = consumer(llama_dir)
    out = cons.generate(PROMPTS[0], decode_params(prefilled), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == reference[0] and out.num_cached_tokens == 0
    assert num_staged(prod) == [1]  # left for the timeout


def test_decode_side_preemption(llama_dir, reference):
    """A consumer cache too small for both requests' decodes: one is preempted after its
    pull and recomputed (the producer's copy is gone by then); the tokens stay the same."""
    prod = producer(llama_dir, get_open_port())
    prefilled = prod.generate(PROMPTS, PREFILL, use_tqdm=False)
    cons = consumer(llama_dir, num_gpu_blocks_override=27)
    outs = cons.generate(PROMPTS, decode_params(prefilled), use_tqdm=False)
    assert cons.llm_engine.scheduler_stats().num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert all(o.num_cached_tokens == (len(o.prompt_token_ids) - 1) // 4 * 4 for o in outs)


def serve_prefill(llama_dir, port, prompts, conn, kwargs):
    """A producer engine in a process of its own: prefills, sends the params back, serves
    the KV until told to stop."""
    torch.set_num_threads(1)
    if kwargs.get("connector") == "DyingProducer":
        register_kv_connector("DyingProducer", "tests.kv_transfer.test_load_failures:DyingProducer")
    drop_rank0 = kwargs.pop("drop_rank0", False)
    llm = producer(llama_dir, port, **kwargs)
    outs = llm.generate(prompts, PREFILL, use_tqdm=False)
    if drop_rank0:  # rank 0's staged copies gone (timed out, say): its pulls are refused, rank 1's go
        llm.collective_rpc(lambda worker: worker.rank == 0 and worker.model_runner.kv_connector._staged.clear())
    conn.send([o.kv_transfer_params for o in outs])
    conn.recv()
    conn.send(num_staged(llm))
    llm.shutdown()


@contextlib.contextmanager
def producer_process(llama_dir, prompts, **kwargs):
    """(params per prompt, the pipe) of a producer running in a spawned process."""
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=serve_prefill, args=(llama_dir, get_open_port(), prompts, there, kwargs))
    proc.start()
    try:
        if not here.poll(240):
            raise TimeoutError("the producer process did not prefill in time")
        yield proc, here, here.recv()
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()


def test_producer_in_another_process(llama_dir, reference):
    with producer_process(llama_dir, PROMPTS) as (proc, pipe, params):
        cons = consumer(llama_dir)
        outs = cons.generate(PROMPTS, decode_params(params), use_tqdm=False)
        pipe.send("done")
        assert pipe.recv() == [0]
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert all(o.num_cached_tokens == (len(o.prompt_token_ids) - 1) // 4 * 4 for o in outs)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_tp2_on_both_sides(llama_dir, reference):
    """Rank r pulls its shard from producer rank r (each pair its own gloo group)."""
    with producer_process(llama_dir, PROMPTS, tensor_parallel_size=2) as (proc, pipe, params):
        assert all(p["remote_tp_size"] == 2 for p in params)
        cons = consumer(llama_dir, tensor_parallel_size=2)
        try:
            outs = cons.generate(PROMPTS, decode_params(params), use_tqdm=False)
        finally:
            cons.shutdown()
        pipe.send("done")
        assert pipe.recv() == [0, 0]
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert all(o.num_cached_tokens == (len(o.prompt_token_ids) - 1) // 4 * 4 for o in outs)


def test_the_hydra_preset_and_clear_errors(llama_dir):
    cfg = build_config(["model=opt-125m", "load.format=dummy", "kv_transfer=p2p", "kv_transfer.kv_port=15000"])
    assert (cfg.kv_transfer.kv_connector, cfg.kv_transfer.kv_role, cfg.kv_transfer.kv_port) == (
        "P2pConnector",
        "kv_producer",
        15000,
    )
    with pytest.raises(ValueError, match=r"kv_transfer.kv_port=0: must be a port in \[1, 65535\]"):
        build_config(["model=opt-125m", "load.format=dummy", "kv_transfer=p2p", "kv_transfer.kv_port=0"])
    with pytest.raises(ValueError, match="kv_role must be kv_producer or kv_consumer"):
        LLM(str(llama_dir), kv_transfer_config={"kv_connector": "P2pConnector"}, **KWARGS)
    config = {"kv_connector": "P2pConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": {"x": 1}}
    with pytest.raises(ValueError, match="unknown key.*x for P2pConnector; known: abort_request_timeout"):
        LLM(str(llama_dir), kv_transfer_config=config, **KWARGS)


def test_a_taken_kv_port_is_a_clear_error(llama_dir):
    port = get_open_port()
    first = producer(llama_dir, port)
    with pytest.raises(Exception, match=rf"127.0.0.1:{port}, which cannot be bound .*give another kv_transfer.kv_port"):
        producer(llama_dir, port)
    assert first.generate(PROMPTS[0], PREFILL, use_tqdm=False)[0].kv_transfer_params["remote_port"] == port


def test_unpulled_kv_is_dropped_after_the_timeout(llama_dir):
    """abort_request_timeout: a producer's next save drops copies older than it."""
    config = {
        "kv_connector": "P2pConnector",
        "kv_role": "kv_producer",
        "kv_port": get_open_port(),
        "kv_connector_extra_config": {"abort_request_timeout": 0.05},
    }
    prod = LLM(str(llama_dir), kv_transfer_config=config, **KWARGS)
    prod.generate(PROMPTS[0], PREFILL, use_tqdm=False)
    assert num_staged(prod) == [1]
    time.sleep(0.1)  # past the timeout (a lower bound, whatever the load)
    prod.generate(PROMPTS[1], PREFILL, use_tqdm=False)
    assert num_staged(prod) == [1]  # the first one dropped, the second staged

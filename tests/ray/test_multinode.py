"""minivllm on a two-node Ray cluster, simulated on this machine with Ray's own
``ray.cluster_utils.Cluster``: a head and a worker node of one CPU each, so two ranks
(or two replicas) of one CPU each must land on different nodes. One cluster serves the
whole module (starting one costs seconds), and the server's engine with replicas on
Ray runs on it too; the test that loses a node runs last.

Oracle: the same checkpoint at tp=1 in this process, greedy, token for token and
logprob for logprob. Skipped only where Ray is not installed."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time

import httpx
import pytest

from minivllm import LLM, SamplingParams
from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.request_stream import EngineDeadError
from minivllm.executor.ray_executor import RayDistributedExecutor
from tests.executor import tp_helpers as h

ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'minivllm[ray]'); CI installs it")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    """Head + one worker node, one CPU each; torn down with no process left behind."""
    before = h.child_pids()
    two = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, include_dashboard=False))
    two.add_node(num_cpus=1)
    two.wait_for_nodes()
    ray.init(address=two.address, log_to_driver=False)
    yield two
    gc.collect()
    ray.shutdown()
    two.shutdown()
    assert h.wait_until(lambda: not (h.child_pids() - before), timeout=15), h.child_pids() - before


@pytest.fixture(scope="module")
def opt_reference(opt_dir):
    return h.reference(opt_dir)


def _ray_llm(ckpt, *overrides: str, **kwargs) -> LLM:
    return LLM(model=str(ckpt), distributed_executor_backend="ray", overrides=list(overrides), **h.LLM_KWARGS, **kwargs)


def _worker_node(cluster) -> str:
    return next(iter(cluster.worker_nodes)).node_id


@pytest.mark.timeout(60)
def test_a_job_the_cluster_can_never_hold_fails_at_once(cluster, opt_dir):
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"STRICT_PACK puts every bundle on one node, and the largest fits 1"):
        _ray_llm(opt_dir, "parallel.placement_strategy=STRICT_PACK", tensor_parallel_size=2)
    with pytest.raises(ValueError, match=r"can never hold 4 bundle\(s\) of \{CPU: 1\}.*all nodes together fit 2"):
        _ray_llm(opt_dir, tensor_parallel_size=4)
    assert time.monotonic() - start < 10  # no wait for resources that cannot appear


@pytest.mark.timeout(180)
def test_pp2_strict_spread_puts_a_stage_on_each_node(cluster, opt_dir, opt_reference):
    llm = _ray_llm(opt_dir, "parallel.placement_strategy=STRICT_SPREAD", pipeline_parallel_size=2)
    try:
        executor = llm.llm_engine.core.executor
        assert type(executor) is RayDistributedExecutor
        assert len(set(executor.worker_node_ids)) == 2 and _worker_node(cluster) in executor.worker_node_ids
        assert len(set(executor.worker_pids)) == 2 and os.getpid() not in executor.worker_pids
        h.assert_same_outputs(opt_reference, h.generate(llm))
    finally:
        llm.shutdown()
    assert h.wait_until(lambda: not any(h.alive(p) for p in executor.worker_pids), timeout=10)


@pytest.mark.timeout(180)
def test_dp2_replicas_are_ray_actors_on_both_nodes(cluster, opt_dir, opt_reference):
    llm = LLM(model=str(opt_dir), data_parallel_size=2, data_parallel_backend="ray", **h.LLM_KWARGS)
    try:
        engine = llm.llm_engine
        replicas = engine.replicas
        assert {r.node_id for r in replicas} == {cluster.head_node.node_id, _worker_node(cluster)}
        assert sorted(engine.ray_replicas.bundle_node_ids) == sorted(r.node_id for r in replicas)
        h.assert_same_outputs(opt_reference, h.generate(llm))
        assert all(n > 0 for n in engine.balancer.routed), engine.balancer.routed  # both replicas served
        assert [s.num_running for s in engine.replica_stats()] == [0, 0]
        os.kill(replicas[1].pid, signal.SIGKILL)  # a replica's actor dies: the next call fails naming it
        with pytest.raises(RuntimeError, match=r"data-parallel replica 1: Ray actor on node \w+ \(.+\) died"):
            h.generate(llm)
    finally:
        llm.shutdown()
    assert h.wait_until(lambda: not any(r.is_alive() for r in replicas), timeout=10)


@pytest.mark.timeout(180)
def test_server_dp2_replicas_are_ray_actors_and_a_killed_one_fails_its_request(
    cluster, make_engine, opt_dir, opt_reference
):
    """task=serve's engine (AsyncLLM, over HTTP for health) with a replica actor on each node:
    dp=1's outputs, both replicas used, aborts and stats reach the actors, a dead one fails clearly."""
    with make_engine(opt_dir, data_parallel_size=2, data_parallel_backend="ray", **h.LLM_KWARGS) as harness:
        engine = harness.engine
        replicas = engine.client.engines
        assert {r.node_id for r in replicas} == {cluster.head_node.node_id, _worker_node(cluster)}
        assert sorted(engine.engine_pids) == sorted(r.pid for r in replicas) and os.getpid() not in engine.engine_pids
        h.assert_same_outputs(opt_reference, harness.run(_generate_all(engine, h.PROMPTS, h.GREEDY)))
        assert all(n > 0 for n in engine.balancer.routed), engine.balancer.routed  # both replicas served
        harness.run(_abort_mid_request(engine))
        server = harness.start_server()
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            assert http.get("/health").status_code == 200
            victim = harness.run(_kill_replica_mid_request(engine))
            health = http.get("/health")
        assert health.status_code == 503
        assert f"data-parallel replica {victim}: Ray actor on node" in health.json()["error"]["message"]
    assert h.wait_until(lambda: not any(r.is_alive() for r in replicas), timeout=10)


async def _generate_all(engine: AsyncLLM, prompts: list[str], params: SamplingParams) -> list:
    async def final(i: int, prompt: str):
        async for out in engine.generate(prompt, params, f"greedy-{i}"):
            last = out
        return last

    return await asyncio.gather(*(final(i, p) for i, p in enumerate(prompts)))


LONG = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)


async def _abort_mid_request(engine: AsyncLLM) -> None:
    """An abort reaches the replica actor: its stream ends at once, and the replicas' stats,
    answered after the abort, show nothing left running."""
    stream = await engine.add_request("aborted", h.PROMPTS[1], LONG)
    await stream.__anext__()
    await engine.abort("aborted")
    rest = [out async for out in stream]
    assert rest[-1].outputs[0].finish_reason == "abort"
    assert [s.num_running + s.num_waiting for s in await engine.replica_stats()] == [0, 0]


async def _kill_replica_mid_request(engine: AsyncLLM) -> int:
    """SIGKILL the actor of the replica running a long request once its first token is out:
    the stream fails naming that replica. Returns the replica."""
    stream = await engine.add_request("long", h.PROMPTS[0], LONG)
    victim = engine.balancer.load.index(1)
    await stream.__anext__()
    os.kill(engine.engine_pids[victim], signal.SIGKILL)
    with pytest.raises(EngineDeadError, match=rf"data-parallel replica {victim}: Ray actor on node \w+ \(.+\) died"):
        async for _ in stream:
            pass
    return victim


@pytest.mark.timeout(240)
def test_tp2_spans_both_nodes_a_full_cluster_fails_clearly_and_a_lost_node_fails_fast(cluster, opt_dir, opt_reference):
    """Last in the module: it takes the worker node away. One engine for the three checks
    (each engine costs two actors that import torch)."""
    llm = _ray_llm(opt_dir, tensor_parallel_size=2)
    remover: threading.Thread | None = None
    try:
        executor = llm.llm_engine.core.executor
        lost = _worker_node(cluster)
        assert set(executor.worker_node_ids) == {cluster.head_node.node_id, lost}
        h.assert_same_outputs(opt_reference, h.generate(llm))

        # Both CPUs are taken: a second engine fails after its bounded wait, saying what it needs.
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"no room for 2 bundle\(s\) of \{CPU: 1\} placed PACK for 1 s"):
            _ray_llm(opt_dir, "parallel.placement_timeout_s=1", tensor_parallel_size=2)
        assert time.monotonic() - start < 10

        # The worker node goes away while a generate is in flight: the call fails naming its rank.
        rank = executor.worker_node_ids.index(lost)
        removing = threading.Event()
        remover = threading.Thread(target=_remove_once_running, args=(cluster, llm, removing), daemon=True)
        remover.start()
        long = h.GREEDY.clone()
        long.max_tokens, long.ignore_eos = 100, True
        with pytest.raises(RuntimeError, match=rf"worker rank {rank} died on node {lost[:12]}"):
            llm.generate(h.PROMPTS, long, use_tqdm=False)
        assert removing.is_set() and time.monotonic() - removing.at < 10  # type: ignore[attr-defined]
        with pytest.raises(RuntimeError, match="has failed"):
            h.generate(llm)
    finally:
        llm.shutdown()
        if remover is not None:  # the node's removal finishes before the cluster's teardown removes the rest
            remover.join(timeout=60)


def _remove_once_running(cluster, llm: LLM, removing: threading.Event) -> None:
    """Remove the worker node as soon as the engine has a request in flight."""
    while not llm.llm_engine.has_unfinished_requests():
        time.sleep(0.005)
    removing.at = time.monotonic()  # type: ignore[attr-defined]
    removing.set()
    cluster.remove_node(next(iter(cluster.worker_nodes)))

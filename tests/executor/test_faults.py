"""A worker that dies or raises fails the engine fast, naming the rank; no process
is left behind; a rendezvous port taken by someone else is retried."""

from __future__ import annotations

import socket

import pytest

from minivllm import LLM
from minivllm.distributed import utils as dist_utils
from minivllm.executor import multiproc
from tests.executor import tp_helpers as h

pytestmark = pytest.mark.slow


@pytest.mark.timeout(120)
def test_killed_worker_fails_fast_naming_the_rank(opt_dir):
    """tp=2 here; pp=2 in test_pipeline_parallel.py (on its engine)."""
    h.assert_fails_fast_when_rank_1_is_killed(LLM(model=str(opt_dir), tensor_parallel_size=2, **h.LLM_KWARGS))


@pytest.mark.timeout(120)
def test_raising_worker_fails_fast_with_its_exception(opt_dir):
    llm = LLM(
        model=str(opt_dir),
        tensor_parallel_size=2,
        overrides=["parallel.worker._target_=tests.executor.faulty_worker.FailingWorker"],
        **h.LLM_KWARGS,
    )
    pids = llm.llm_engine.core.executor.worker_pids
    with pytest.raises(RuntimeError, match=r"worker rank 1 raised ValueError: injected fault on rank 1"):
        h.generate(llm)  # rank 0 is blocked in an all-reduce rank 1 never joins: it must not hang
    assert h.wait_until(lambda: not any(h.alive(p) for p in pids), timeout=5)


@pytest.mark.timeout(180)
def test_port_in_use_is_retried(opt_dir, monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        picked = []

        def pick_port() -> int:
            picked.append(taken if not picked else dist_utils.get_open_port())
            return picked[-1]

        monkeypatch.setattr(multiproc, "get_open_port", pick_port)
        llm = LLM(model=str(opt_dir), tensor_parallel_size=2, **h.LLM_KWARGS)
    assert len(picked) == 2 and picked[0] == taken
    assert [o.outputs[0].token_ids for o in h.generate(llm)] == [o.outputs[0].token_ids for o in h.reference(opt_dir)]
    llm.shutdown()


def test_retry_gives_up_with_a_clear_error():
    calls, stops = [], []

    def start():
        calls.append(1)
        raise RuntimeError("worker rank 0 raised DistNetworkError: port 1234, name: EADDRINUSE")

    with pytest.raises(RuntimeError, match=r"the rendezvous port was already in use on 3 tries.*EADDRINUSE"):
        dist_utils.retry_on_address_in_use(start, lambda: stops.append(1), "test")
    assert len(calls) == len(stops) == 3


def test_other_start_failures_are_not_retried():
    calls = []

    def start():
        calls.append(1)
        raise RuntimeError("worker rank 1 raised FileNotFoundError: model.safetensors")

    with pytest.raises(RuntimeError, match="FileNotFoundError"):
        dist_utils.retry_on_address_in_use(start, lambda: None, "test")
    assert len(calls) == 1

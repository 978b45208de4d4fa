"""Helpers for the tensor-parallel tests: reference runs, output comparison, and
finding processes (the tests check that none outlives its engine).

The functions taking a ``worker`` first run inside the worker processes
(through ``collective_rpc``), so they live in an importable module."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from minivllm import LLM, SamplingParams

PROMPTS = ["def fibonacci(n):", "import os\nimport", "class Stack:\n    def push(self"]
GREEDY = SamplingParams(temperature=0, max_tokens=10, logprobs=3)
LLM_KWARGS = dict(dtype="float32", block_size=8, num_gpu_blocks_override=64, max_model_len=128)


def generate(llm: LLM) -> list:
    return llm.generate(PROMPTS, GREEDY, use_tqdm=False)


def reference(ckpt: Path) -> list:
    """Greedy outputs of the same checkpoint with tp=1, in this process."""
    llm = LLM(model=str(ckpt), **LLM_KWARGS)
    try:
        return generate(llm)
    finally:
        llm.shutdown()


def assert_same_outputs(expected: list, actual: list, atol: float = 1e-4) -> None:
    for exp, act in zip(expected, actual, strict=True):
        e, a = exp.outputs[0], act.outputs[0]
        assert a.token_ids == e.token_ids, exp.prompt
        assert len(a.logprobs) == len(e.logprobs)
        for pos, (le, la) in enumerate(zip(e.logprobs, a.logprobs)):
            assert set(la) == set(le), (exp.prompt, pos)
            for token, value in le.items():
                assert abs(la[token] - value) <= atol, (exp.prompt, pos, token, la[token], value)


def assert_fails_fast_when_rank_1_is_killed(llm: LLM) -> None:
    """SIGKILL rank 1: the next step fails naming it, within seconds, with no rank left
    running, and the engine says it has failed from then on."""
    pids = llm.llm_engine.core.executor.worker_pids
    os.kill(pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"worker rank 1 died: killed by SIGKILL"):
        generate(llm)
    assert time.monotonic() - start < 15  # noticed from the process sentinel, not a timeout
    assert wait_until(lambda: not any(alive(p) for p in pids), timeout=5)  # the other ranks stopped too
    with pytest.raises(RuntimeError, match="has failed"):
        generate(llm)


# ---- run inside workers --------------------------------------------------------------
def param_shapes(worker) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in worker.model_runner.model.named_parameters()}


def param_values(worker, name: str) -> torch.Tensor:
    return dict(worker.model_runner.model.named_parameters())[name].detach().clone()


def kv_cache_shape(worker) -> tuple[int, ...]:
    return tuple(worker.model_runner.kv_caches[0].shape)


def num_threads(worker) -> int:
    return torch.get_num_threads()


def raise_on_rank_1(worker) -> None:
    if worker.rank == 1:
        raise ValueError("injected fault on rank 1")


# ---- processes -------------------------------------------------------------------------
def child_pids(pid: int | None = None) -> set[int]:
    """Live (not zombie) processes whose parent is ``pid`` (this process by default),
    leaving out multiprocessing's resource tracker: one per interpreter, started with
    the first spawned process, it exits with the interpreter."""
    pid = os.getpid() if pid is None else pid
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(ppid) == pid and state != "Z" and b"resource_tracker" not in cmdline:
            found.add(int(entry.name))
    return found


def pids_with_env(key: str, value: str, with_tracker: bool = True) -> set[int]:
    """Live processes whose environment has ``key=value`` (children inherit it);
    ``with_tracker=False`` leaves out multiprocessing's resource tracker."""
    needle = f"{key}={value}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                tracker = b"resource_tracker" in (entry / "cmdline").read_bytes()
                if state != "Z" and (with_tracker or not tracker):
                    found.add(int(entry.name))
        except OSError:
            continue
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_until(predicate, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()

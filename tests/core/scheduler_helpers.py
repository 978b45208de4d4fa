"""Factories for scheduler tests, and a fake model runner that checks KV contents.

``FakeRunner`` keeps the worker's side of the protocol (request states built
from ``new_reqs``/``cached_reqs`` deltas, plus the tokens it samples itself) and a fake KV cache: a slot holds the
identity of the whole prefix that ends at its position. Before a request's new
tokens are "computed", every earlier position of its block table must hold
exactly its own prefix; so a prefix-cache hit on the wrong block, a block
reused while still referenced, or a block cached without being computed fails
loudly. Requests run in batch order, so a request may read blocks that another
request, scheduled before it, writes in the same step (as in the real forward
pass, where each layer writes the whole batch's KV before attending). Sampled
tokens are a deterministic function of the sequence, like greedy decoding.
"""

from __future__ import annotations

import copy
import itertools

from minivllm.config.store import build_config
from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.outputs import ModelRunnerOutput
from minivllm.request import Request, RequestId
from minivllm.sampling_params import SamplingParams

_ids = itertools.count()


def base_config() -> VllmConfig:
    return build_config(["model=opt-125m", "load.format=dummy"])


def make_scheduler(base: VllmConfig, num_blocks: int, **fields) -> Scheduler:
    """A scheduler over ``num_blocks`` blocks; ``fields`` set cache.* / scheduler.* keys by name."""
    cfg = copy.deepcopy(base)
    for name, value in fields.items():
        group = cfg.cache if hasattr(cfg.cache, name) else cfg.scheduler
        assert hasattr(group, name), name
        setattr(group, name, value)
    return Scheduler(cfg, KVCacheSpec(cfg.cache.block_size, num_blocks))


def make_request(
    tokens: list[int], max_tokens: int = 4, priority: int = 0, cache_salt: str | None = None, req_id: str | None = None
) -> Request:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    rid = RequestId(req_id if req_id is not None else f"r{next(_ids)}")
    return Request(
        rid, list(tokens), params, eos_token_id=None, max_tokens=max_tokens, priority=priority, cache_salt=cache_salt
    )


def next_token(tokens: list[int]) -> int:
    """The fake model's greedy choice: depends on the whole sequence."""
    h = 0
    for t in tokens:
        h = (h * 1_000_003 + t) % 2_147_483_647
    return 3 + h % 500


class FakeRunner:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.kv: dict[int, tuple[int, ...]] = {}
        self.states: dict[RequestId, dict] = {}

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        for req_id in scheduler_output.forget_req_ids:
            self.states.pop(req_id, None)
        for new in scheduler_output.new_reqs:
            self.states[new.req_id] = {
                "tokens": list(new.token_ids),
                "blocks": list(new.block_ids),
                "computed": new.num_computed_tokens,
            }
        cached = scheduler_output.cached_reqs
        for req_id, blocks, computed in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens):
            state = self.states[req_id]
            state["blocks"].extend(blocks or [])
            state["computed"] = computed
        out = ModelRunnerOutput()
        for k in range(scheduler_output.num_steps):  # multi-step decoding: every request decodes each step
            for req_id, n in scheduler_output.num_scheduled_tokens.items():
                self._compute(req_id, n if k == 0 else 1, out)
        return out

    def _compute(self, req_id: RequestId, n: int, out: ModelRunnerOutput) -> None:
        state = self.states[req_id]
        tokens, start = state["tokens"], state["computed"]
        for pos in range(start):
            assert self.kv.get(self._slot(state, pos)) == tuple(tokens[: pos + 1]), (req_id, pos)
        for pos in range(start, start + n):
            assert pos // self.block_size < len(state["blocks"]), (req_id, pos, "no slot allocated")
            self.kv[self._slot(state, pos)] = tuple(tokens[: pos + 1])
        state["computed"] = start + n
        if state["computed"] == len(tokens):
            token = next_token(tokens)
            out.sampled_token_ids.setdefault(req_id, []).append(token)
            tokens.append(token)  # a runner keeps what it samples

    def _slot(self, state: dict, pos: int) -> int:
        return state["blocks"][pos // self.block_size] * self.block_size + pos % self.block_size


def step(scheduler: Scheduler, runner: FakeRunner) -> SchedulerOutput:
    scheduler_output = scheduler.schedule()
    scheduler.update_from_output(scheduler_output, runner.execute(scheduler_output))
    return scheduler_output


def run_to_completion(scheduler: Scheduler, runner: FakeRunner, max_steps: int = 10_000) -> list[SchedulerOutput]:
    outs = []
    while scheduler.has_unfinished_requests():
        outs.append(step(scheduler, runner))
        assert scheduler.kv.usage <= 1.0
        assert len(outs) < max_steps, "no progress"
    return outs


def expected_output(prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt) :]

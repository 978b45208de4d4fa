"""Where an engine step's time goes, measured from outside the engine.

Each step's shape (tokens, requests, context read) comes from the scheduler
output handed to the executor; wrappers on the model runner's ``_forward``
(eager or a CUDA-graph replay alike: a replayed graph never calls the model's
modules, so module hooks would miss it) and on ``compute_logits`` time the
model. Whatever else a step spends (scheduling, input preparation, sampling,
output processing, detokenizing) is the engine's overhead::

    step wall time = model forward + logits  +  engine overhead

With the model out of reach (workers in other processes), only wall times and
shapes are recorded.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass(slots=True)
class StepRecord:
    wall_s: float
    model_s: float
    num_tokens: int
    num_reqs: int
    kv_tokens: int
    """Context tokens the step's attention reads (sum of seq_lens)."""
    decode_only: bool


@dataclass
class StepTimer:
    executor: Any
    model_runner: Any | None
    device: torch.device
    steps: list[StepRecord] = field(default_factory=list)
    _model_s: float = 0.0
    _started: float | None = None
    _shape: tuple[int, int, int, bool] | None = None
    _undo: list[Callable[[], None]] = field(default_factory=list)

    @property
    def sees_model(self) -> bool:
        return self.model_runner is not None and getattr(self.model_runner, "model", None) is not None

    def attach(self) -> "StepTimer":
        execute = self.executor.execute_model

        def observed_execute(sched: Any) -> Any:
            self._shape = _shape(sched)
            return execute(sched)

        self.executor.execute_model = observed_execute
        self._undo = [lambda: delattr(self.executor, "execute_model")]
        if self.sees_model:
            self._time_model(self.model_runner)
        return self

    def _time_model(self, runner: Any) -> None:
        for owner, name in ((runner, "_forward"), (runner.model, "compute_logits")):
            self._undo.append(self._wrap(owner, name))

    def _wrap(self, owner: Any, name: str) -> Callable[[], None]:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            self._start()
            try:
                return inner(*args, **kwargs)
            finally:
                self._stop()

        setattr(owner, name, timed)
        return lambda: delattr(owner, name)

    def detach(self) -> None:
        for undo in self._undo:
            undo()
        self._undo = []

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _start(self) -> None:
        self._sync()
        self._started = time.perf_counter()

    def _stop(self) -> None:
        self._sync()
        if self._started is not None:
            self._model_s += time.perf_counter() - self._started
            self._started = None

    def run_step(self, step: Callable[[], list]) -> list:
        """Run one engine step and record its timings."""
        self._model_s, self._shape = 0.0, None
        start = time.perf_counter()
        outputs = step()
        self._sync()
        wall = time.perf_counter() - start
        shape = self._shape or (0, 0, 0, False)
        self.steps.append(StepRecord(wall, self._model_s, *shape))
        return outputs

    def reset(self) -> None:
        self.steps = []

    def summary(self, decode_only: bool = False) -> dict[str, float | int | None]:
        steps = [s for s in self.steps if s.decode_only] if decode_only else self.steps
        wall = sum(s.wall_s for s in steps)
        prefill = [s for s in steps if not s.decode_only]
        out: dict[str, float | int | None] = {
            "num_steps": len(steps),
            "step_time_s": wall,
            "num_prefill_steps": len(prefill),
            "prefill_step_time_s": sum(s.wall_s for s in prefill),
        }
        if not self.sees_model or not steps:
            out.update(model_time_s=None, overhead_s=None, overhead_per_step_ms=None, overhead_fraction=None)
            return out
        model = sum(s.model_s for s in steps)
        out.update(
            model_time_s=model,
            overhead_s=wall - model,
            overhead_per_step_ms=1e3 * (wall - model) / len(steps),
            overhead_fraction=(wall - model) / wall if wall > 0 else None,
        )
        return out


def _shape(sched: Any) -> tuple[int, int, int, bool]:
    """(new tokens, requests, context tokens read, decode only) of a SchedulerOutput."""
    computed = {r.req_id: r.num_computed_tokens for r in sched.new_reqs}
    computed.update(zip(sched.cached_reqs.req_ids, sched.cached_reqs.num_computed_tokens))
    scheduled = sched.num_scheduled_tokens
    kv_tokens = sum(computed.get(req, 0) + n for req, n in scheduled.items())
    return sum(scheduled.values()), len(scheduled), kv_tokens, bool(scheduled) and all(n == 1 for n in scheduled.values())

"""Where a benchmark's time goes: an engine step's parts, the bandwidth floor of the
recorded steps, and one kernel call.

**An engine step** (``StepTimer``), measured from outside the engine.
Each step's shape (tokens, requests, context read) comes from the scheduler
output handed to the executor; wrappers on the model runner's ``_forward``
(eager or a CUDA-graph replay alike: a replayed graph never calls the model's
modules, so module hooks would miss it) and on ``compute_logits`` time the
model. Whatever else a step spends (scheduling, input preparation, sampling,
output processing, detokenizing) is the engine's overhead::

    step wall time = model forward + logits  +  vision encoder  +  engine overhead

The vision encoder (an image model's ``MultiModalRunner.encode``) is timed apart
from the model: ``encoder_s`` per step, and its share of the step time.

With the model out of reach (workers in other processes), only wall times and
shapes are recorded.

Nothing here waits for the device: with async scheduling a step launches the
next batch before it collects the last one, and a synchronization per step
would undo that overlap. On a GPU the model is timed with CUDA events, read
when ``steps`` is first looked at after the run; a step's wall time is the
host time of its ``step()`` call (which waits for the tokens it returns).
Under async scheduling a step's record holds the shape (and model time) of
the batch it launched, while its wall time mostly waits for the one before:
sums over a run are exact, single steps are off by one.

**The bandwidth floor** (``roofline``): the least time the recorded steps could take
if every step only had to stream its bytes through memory once.
Decoding small batches is memory-bound: each step reads every weight once and
the KV cache of every scheduled token's context::

    floor = sum over steps (weight bytes + kv tokens read x kv bytes per token) / bandwidth

``bandwidth`` is measured here with a large device-to-device copy (read + write).
``achieved_fraction = floor / measured time``: 1.0 would be perfect streaming.
Compute-bound prefill steps make the floor loose, so the fraction is a lower bound
on how well the decode steps use memory bandwidth.

**One kernel call** (``kernel_timer``), for the kernel benchmarks
(``benchmarks/attention.py``, ``moe.py``, ``quant_gemm.py``). This module imports
torch only: a kernel benchmark loads Triton's kernels later.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn


@dataclass(slots=True)
class StepRecord:
    wall_s: float
    model_s: float
    num_tokens: int
    num_reqs: int
    kv_tokens: int
    """Context tokens the step's attention reads (sum of seq_lens)."""
    decode_only: bool
    encoder_s: float = 0.0
    """Time in the vision encoder (image models; 0 for the others)."""


@dataclass
class StepTimer:
    executor: Any
    model_runner: Any | None
    device: torch.device
    _steps: list[StepRecord] = field(default_factory=list)
    _seconds: dict[str, float] = field(default_factory=dict)
    """CPU: seconds of the current step per timed part ("model", "encoder")."""
    _started: Any = None
    _events: dict[str, list[tuple[Any, Any]]] = field(default_factory=dict)
    """CUDA: (start, end) events per timed part of the current step."""
    _unread: list[tuple[int, str, list[tuple[Any, Any]]]] = field(default_factory=list)
    """CUDA: (step index, part, its events) not yet read into the step's ``<part>_s``."""
    _shape: tuple[int, int, int, bool] | None = None
    _undo: list[Callable[[], None]] = field(default_factory=list)

    @property
    def sees_model(self) -> bool:
        return self.model_runner is not None and getattr(self.model_runner, "model", None) is not None

    @property
    def times_encoder(self) -> bool:
        """An image model in this process: its vision encoder is timed."""
        return self.sees_model and getattr(self.model_runner, "mm", None) is not None

    @property
    def steps(self) -> list[StepRecord]:
        """The records so far (reading the model times of CUDA events waits for them)."""
        for index, part, events in self._unread:
            events[-1][1].synchronize()  # elapsed_time refuses events the device has not reached
            setattr(self._steps[index], f"{part}_s", sum(start.elapsed_time(end) for start, end in events) / 1e3)
        self._unread = []
        return self._steps

    def attach(self) -> "StepTimer":
        for name in ("execute_model", "execute_model_async"):  # sync / async scheduling
            if hasattr(self.executor, name):
                self._undo.append(self._observe(name))
        if self.sees_model:
            self._time_model(self.model_runner)
        return self

    def _observe(self, name: str) -> Callable[[], None]:
        execute = getattr(self.executor, name)

        def observed_execute(sched: Any) -> Any:
            self._shape = _shape(sched)
            return execute(sched)

        setattr(self.executor, name, observed_execute)
        return lambda: delattr(self.executor, name)

    def _time_model(self, runner: Any) -> None:
        for owner, name in ((runner, "_forward"), (runner.model, "compute_logits")):
            self._undo.append(self._wrap(owner, name, "model"))
        if self.times_encoder:
            self._undo.append(self._wrap(runner.mm, "encode", "encoder"))

    def _wrap(self, owner: Any, name: str, part: str) -> Callable[[], None]:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            self._start()
            try:
                return inner(*args, **kwargs)
            finally:
                self._stop(part)

        setattr(owner, name, timed)
        return lambda: delattr(owner, name)

    def detach(self) -> None:
        for undo in self._undo:
            undo()
        self._undo = []

    def _start(self) -> None:
        if self.device.type == "cuda":
            self._started = torch.cuda.Event(enable_timing=True)
            self._started.record()
        else:
            self._started = time.perf_counter()

    def _stop(self, part: str) -> None:
        if self._started is None:
            return
        if self.device.type == "cuda":
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.setdefault(part, []).append((self._started, end))
        else:
            self._seconds[part] = self._seconds.get(part, 0.0) + time.perf_counter() - self._started
        self._started = None

    def run_step(self, step: Callable[[], list]) -> list:
        """Run one engine step and record its timings."""
        self._seconds, self._shape, self._events = {}, None, {}
        start = time.perf_counter()
        outputs = step()
        wall = time.perf_counter() - start
        shape = self._shape or (0, 0, 0, False)
        for part, events in self._events.items():
            self._unread.append((len(self._steps), part, events))
        seconds = self._seconds
        self._steps.append(StepRecord(wall, seconds.get("model", 0.0), *shape, seconds.get("encoder", 0.0)))
        return outputs

    def reset(self) -> None:
        self._steps, self._unread = [], []

    def summary(self, decode_only: bool = False) -> dict[str, float | int | None]:
        steps = [s for s in self.steps if s.decode_only] if decode_only else self.steps
        wall = sum(s.wall_s for s in steps)
        prefill = [s for s in steps if s.num_tokens and not s.decode_only]  # not async's empty last step
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
        encoder = sum(s.encoder_s for s in steps)
        overhead = wall - model - encoder
        out.update(
            model_time_s=model,
            overhead_s=overhead,
            overhead_per_step_ms=1e3 * overhead / len(steps),
            overhead_fraction=overhead / wall if wall > 0 else None,
        )
        if self.times_encoder:
            out.update(encoder_time_s=encoder, encoder_fraction=encoder / wall if wall > 0 else None)
        return out


def _shape(sched: Any) -> tuple[int, int, int, bool]:
    """(new tokens, requests, context tokens read, decode only) of a SchedulerOutput."""
    computed = {r.req_id: r.num_computed_tokens for r in sched.new_reqs}
    computed.update(zip(sched.cached_reqs.req_ids, sched.cached_reqs.num_computed_tokens))
    scheduled = sched.num_scheduled_tokens
    kv_tokens = sum(computed.get(req, 0) + n for req, n in scheduled.items())
    return (
        sum(scheduled.values()),
        len(scheduled),
        kv_tokens,
        bool(scheduled) and all(n == 1 for n in scheduled.values()),
    )


# ---- the bandwidth floor ------------------------------------------------------------------


def measure_copy_bandwidth(device: torch.device, num_bytes: int = 256 << 20, repeats: int = 5) -> float:
    """Bytes per second moved by ``dst.copy_(src)`` on ``device`` (each byte read once and written once)."""
    n = num_bytes // 4
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch / warm-up
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    del src, dst
    return 2 * n * 4 / best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of distinct parameters (tied weights counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def kv_bytes_per_token(kv_caches: list[torch.Tensor]) -> int:
    """Bytes of keys + values one token occupies across all layers: each cache is
    (2, num_blocks, block_size, kv_heads, head_dim)."""
    return sum(2 * c.shape[-2] * c.shape[-1] * c.element_size() for c in kv_caches)


def measure_gemm_peak(
    device: torch.device, dtype: torch.dtype = torch.float32, n: int = 1024, repeats: int = 5
) -> float:
    """FLOP/s of a square ``n`` matmul on ``device`` at torch's current thread count (the best of
    ``repeats``: other work on a shared machine only ever slows a run)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    torch.matmul(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        torch.matmul(a, b)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def matmul_params(model: nn.Module) -> tuple[int, int]:
    """(weights every token multiplies by, the LM head's weights: only each request's last token's)."""
    body = head = 0
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, nn.Embedding) or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue
        if name.endswith("lm_head"):
            head += weight.numel()
        else:
            body += weight.numel()
    return body, head


def cpu_compute_roofline(steps: list[StepRecord], model: nn.Module, measured_s: float) -> dict[str, Any]:
    """The CPU's matmul floor: the steps' GEMM FLOPs at this CPU's measured fp32 (or the model's
    dtype) GEMM rate, and the fraction of it the run achieved (all steps, and decode-only ones)."""
    dtype = next(model.parameters()).dtype
    peak = measure_gemm_peak(torch.device("cpu"), dtype)
    body, head = matmul_params(model)
    flops = [2 * (body * s.num_tokens + head * s.num_reqs) for s in steps]
    decode = [(f, s.wall_s) for f, s in zip(flops, steps) if s.decode_only]
    decode_s = sum(t for _, t in decode)
    return {
        "threads": torch.get_num_threads(),
        "gemm_peak_gflop_s": peak / 1e9,
        "matmul_gflop": sum(flops) / 1e9,
        "compute_floor_s": sum(flops) / peak,
        "compute_fraction": sum(flops) / peak / measured_s if measured_s > 0 else None,
        "decode_compute_fraction": sum(f for f, _ in decode) / peak / decode_s if decode_s > 0 else None,
    }


def roofline(steps: list[StepRecord], model_runner: Any, device: torch.device, measured_s: float) -> dict[str, Any]:
    """The floor of the recorded steps and the fraction of it the run achieved (on the CPU, with
    the matmul floor at the measured GEMM rate too: ``cpu_compute_roofline``)."""
    bandwidth = measure_copy_bandwidth(device)
    w_bytes = weight_bytes(model_runner.model)
    kv_token = kv_bytes_per_token(model_runner.kv_caches)
    bytes_moved = sum(w_bytes + s.kv_tokens * kv_token for s in steps if s.num_tokens)
    floor_s = bytes_moved / bandwidth
    decode = [s for s in steps if s.decode_only]
    decode_bytes = sum(w_bytes + s.kv_tokens * kv_token for s in decode)
    decode_s = sum(s.wall_s for s in decode)
    return {
        "device": str(device),
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "weight_bytes": w_bytes,
        "kv_bytes_per_token": kv_token,
        "bytes_moved": bytes_moved,
        "floor_s": floor_s,
        "measured_s": measured_s,
        "achieved_fraction": floor_s / measured_s if measured_s > 0 else None,
        "decode_achieved_fraction": (decode_bytes / bandwidth) / decode_s if decode_s > 0 else None,
        **(cpu_compute_roofline(steps, model_runner.model, measured_s) if device.type == "cpu" else {}),
    }


# ---- one kernel call ----------------------------------------------------------------------

Timer = Callable[[Callable[[], object]], float]


def kernel_timer(device: torch.device, cpu_clock: Callable[[], float] = time.process_time, runs: int = 3) -> Timer:
    """fn -> median seconds per call: Triton's ``do_bench`` on CUDA (after its own warm-up);
    on the CPU, one warm-up call then the median of ``runs`` calls on ``cpu_clock`` (process
    time by default: with one intra-op thread it is the compute time, and other jobs on a
    shared machine do not inflate it as they inflate wall-clock time)."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, return_mode="median") * 1e-3

    def on_the_cpu(fn: Callable[[], object]) -> float:
        fn()
        times = []
        for _ in range(runs):
            start = cpu_clock()
            fn()
            times.append(cpu_clock() - start)
        return statistics.median(times)

    return on_the_cpu

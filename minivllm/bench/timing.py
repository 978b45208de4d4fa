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

**The floor** (``roofline``): the least time the recorded steps could take if
each step only had to stream its bytes through memory once, or (whichever is
longer) only had to do its matrix multiplications at the device's GEMM rate::

    step floor = max(bytes / bandwidth, FLOPs / GEMM rate)
    bytes      = weight bytes + kv tokens read x kv bytes per token
    FLOPs      = 2 x matmul parameters x new tokens          (the layers' GEMMs)
               + 2 x vocab x hidden x requests                (the logits of each request's last token)
               + 4 x layers x heads x head_dim x causal pairs (attention: QK^T and PV)

Decode steps are memory-bound (the bytes term wins); prefill steps over thousands
of tokens are compute-bound (the FLOPs term wins). ``bandwidth`` is measured here
with a device-to-device copy of >= 1 GiB on CUDA timed by CUDA events (bytes read
+ written, as benchmarks/attention.py counts them), a copy of 256 MiB (past any
CPU cache) on the CPU; the GEMM rate with a square matmul in the model's dtype
(8192 on CUDA, 512 on the CPU; oneDNN's on a packed weight where the engine's CPU layers run it). Both are medians of repeats after a warm-up.
``achieved_fraction = floor / measured time``: 1.0 would be perfect. The report
gives the floor's two parts (decode steps' bytes term, prefill steps' floor) and
the measured prefill and decode seconds apart. MoE layers count every expert's
weights as read and every expert as computed (a loose floor for them).

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

from minivllm.quantization.base import cpu_packed_linear, pack_cpu_weight


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
    attn_pairs: int = 0
    """(query, key) pairs the step's causal attention computes: sum over requests of
    new x computed + new x (new + 1) / 2."""


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
    _shape: tuple[int, int, int, bool, int] | None = None
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
        tokens, reqs, kv_tokens, decode_only, pairs = self._shape or (0, 0, 0, False, 0)
        for part, events in self._events.items():
            self._unread.append((len(self._steps), part, events))
        seconds = self._seconds
        model_s, encoder_s = seconds.get("model", 0.0), seconds.get("encoder", 0.0)
        self._steps.append(StepRecord(wall, model_s, tokens, reqs, kv_tokens, decode_only, encoder_s, pairs))
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
            "num_decode_steps": sum(s.decode_only for s in steps),
            "decode_step_time_s": sum(s.wall_s for s in steps if s.decode_only),
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


def _shape(sched: Any) -> tuple[int, int, int, bool, int]:
    """(new tokens, requests, context tokens read, decode only, causal pairs) of a SchedulerOutput."""
    computed = {r.req_id: r.num_computed_tokens for r in sched.new_reqs}
    computed.update(zip(sched.cached_reqs.req_ids, sched.cached_reqs.num_computed_tokens))
    scheduled = sched.num_scheduled_tokens
    kv_tokens = sum(computed.get(req, 0) + n for req, n in scheduled.items())
    pairs = sum(n * computed.get(req, 0) + n * (n + 1) // 2 for req, n in scheduled.items())
    return (
        sum(scheduled.values()),
        len(scheduled),
        kv_tokens,
        bool(scheduled) and all(n == 1 for n in scheduled.values()),
        pairs,
    )


# ---- the bandwidth floor ------------------------------------------------------------------


def _median_seconds(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of ``fn`` after one warm-up call: CUDA events on CUDA, the wall clock on the CPU."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            start_s = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start_s)
    return statistics.median(times)


def measure_copy_bandwidth(device: torch.device, num_bytes: int | None = None, repeats: int = 5) -> float:
    """Bytes per second moved by ``dst.copy_(src)`` on ``device``, each byte read once and written
    once (as benchmarks/attention.py counts them); ``num_bytes`` per buffer: 1 GiB on CUDA,
    256 MiB on the CPU by default. On CUDA, with an engine holding most of the memory, the buffers
    halve until they fit (down to 256 MiB: still far past the L2 cache)."""
    num_bytes = num_bytes or ((1 << 30) if device.type == "cuda" else (256 << 20))
    while True:
        try:
            return _copy_bandwidth(device, num_bytes, repeats)
        except torch.OutOfMemoryError:
            if device.type != "cuda" or num_bytes <= (256 << 20):
                raise
            torch.cuda.empty_cache()
            num_bytes //= 2


def _copy_bandwidth(device: torch.device, num_bytes: int, repeats: int) -> float:
    n = num_bytes // 4
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()  # never time all-zero data
    dst = torch.empty_like(src)
    seconds = _median_seconds(lambda: dst.copy_(src), device, repeats)
    return 2 * n * 4 / seconds


def measure_gemm_rate(
    device: torch.device, dtype: torch.dtype, size: int | None = None, repeats: int = 5, packed: bool = False
) -> float:
    """FLOP/s of a square ``size`` x ``size`` matmul in ``dtype`` (8192 on CUDA, 512 on the CPU); with
    ``packed`` (CPU) oneDNN's matmul on a reordered weight, as the engine's layers run with
    ``device.cpu_packed_linear``."""
    size = size or (8192 if device.type == "cuda" else 512)
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    if packed:
        weight = pack_cpu_weight(b)
        seconds = _median_seconds(lambda: cpu_packed_linear(a, weight, None), device, repeats)
        return 2 * size**3 / seconds
    seconds = _median_seconds(lambda: a @ b, device, repeats)
    return 2 * size**3 / seconds


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
    (2, num_blocks, block_size, kv_heads, head_dim), or an MLA layer's latent cache
    (num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim) with no K/V pair."""
    return sum((2 if c.dim() == 5 else 1) * c.shape[-2] * c.shape[-1] * c.element_size() for c in kv_caches)


@dataclass(frozen=True, slots=True)
class ComputeShape:
    """What a step's FLOPs scale with: matmul parameters per token, the logits' GEMM per
    request, attention per causal (query, key) pair."""

    matmul_params: int
    logits_params: int
    attn_flops_per_pair: int

    def flops(self, step: StepRecord) -> int:
        return (
            2 * self.matmul_params * step.num_tokens
            + 2 * self.logits_params * step.num_reqs
            + self.attn_flops_per_pair * step.attn_pairs
        )


def compute_shape(model: nn.Module, vocab_size: int, num_layers: int, num_heads: int, head_dim: int) -> ComputeShape:
    """Parameters of 2-D (or stacked 3-D expert) weights, less the lookups (embeddings) and those
    with a vocabulary-sized dim (the LM head: one row of logits per request); tied weights once."""
    seen, matmul, logits = set(), 0, 0
    for name, p in model.named_parameters():
        if p.data_ptr() in seen or p.dim() < 2:
            continue
        seen.add(p.data_ptr())
        if vocab_size in p.shape[:2]:
            logits = max(logits, p.numel())
        elif "embed" not in name:
            matmul += p.numel()
    return ComputeShape(matmul, logits, 4 * num_layers * num_heads * head_dim)


def _compute_shape(model_runner: Any) -> ComputeShape:
    hf = model_runner.cfg.hf_text_config
    heads = hf.num_attention_heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    return compute_shape(model_runner.model, hf.vocab_size, hf.num_hidden_layers, heads, head_dim)


def roofline(
    steps: list[StepRecord],
    model_runner: Any,
    device: torch.device,
    measured_s: float,
    output_tokens: int | None = None,
) -> dict[str, Any]:
    """The floor of the recorded steps (bytes at the copy bandwidth, FLOPs at the GEMM rate)
    and the fraction of it the run achieved."""
    bandwidth = measure_copy_bandwidth(device)
    w_bytes = weight_bytes(model_runner.model)
    dtype = next(model_runner.model.parameters()).dtype
    packed = bool(getattr(model_runner.cfg, "cpu_packed_linear", False))
    gemm_rate = measure_gemm_rate(device, dtype if dtype.is_floating_point else torch.float32, packed=packed)
    shape = _compute_shape(model_runner)
    kv_token = kv_bytes_per_token(model_runner.kv_caches)
    launched = [s for s in steps if s.num_tokens]
    memory = [(w_bytes + s.kv_tokens * kv_token) / bandwidth for s in launched]
    compute = [shape.flops(s) / gemm_rate for s in launched]
    floors = [max(m, c) for m, c in zip(memory, compute)]
    decode = [i for i, s in enumerate(launched) if s.decode_only]
    prefill = [i for i, s in enumerate(launched) if not s.decode_only]
    floor_s = sum(floors)
    decode_floor = sum(floors[i] for i in decode)
    decode_s = sum(launched[i].wall_s for i in decode)
    prefill_s = sum(launched[i].wall_s for i in prefill)
    out = {
        "device": str(device),
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "gemm_tflop_s": gemm_rate / 1e12,
        "weight_bytes": w_bytes,
        "kv_bytes_per_token": kv_token,
        "bytes_moved": sum(w_bytes + s.kv_tokens * kv_token for s in launched),
        "flops": sum(shape.flops(s) for s in launched),
        "matmul_params": shape.matmul_params,
        "floor_s": floor_s,
        "decode_floor_s": decode_floor,
        "prefill_floor_s": sum(floors[i] for i in prefill),
        "prefill_memory_floor_s": sum(memory[i] for i in prefill),
        "prefill_compute_floor_s": sum(compute[i] for i in prefill),
        "measured_s": measured_s,
        "decode_measured_s": decode_s,
        "prefill_measured_s": prefill_s,
        "achieved_fraction": floor_s / measured_s if measured_s > 0 else None,
        "decode_achieved_fraction": decode_floor / decode_s if decode_s > 0 else None,
        "prefill_achieved_fraction": (floor_s - decode_floor) / prefill_s if prefill_s > 0 else None,
    }
    if output_tokens is not None:
        out["floor_output_tokens_per_s"] = output_tokens / floor_s if floor_s > 0 else None
    return out


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

"""Helpers for starting tensor-parallel ranks: ports, threads, retries.

Whether a model's shapes split over the ranks is the config's check (``config/parallel.py``)."""

from __future__ import annotations

import ctypes
import logging
import os
import socket
from contextlib import contextmanager
from typing import Callable, Iterator

logger = logging.getLogger(__name__)

LOCALHOST = "127.0.0.1"


def get_open_port(host: str = "") -> int:
    """A port that was free a moment ago on ``host`` (all interfaces by default,
    as the rendezvous store listens on all); the OS picks it when binding port 0.

    Another process may take it before rank 0 binds it; callers retry on
    ``is_address_in_use``.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_address_in_use(message: str) -> bool:
    """Whether an error message (from the rendezvous store) is EADDRINUSE."""
    text = message.lower()
    return "eaddrinuse" in text or "address already in use" in text


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(num_local_ranks: int) -> int:
    """Intra-op threads for each rank so the ranks on one machine share its cores
    instead of each starting one thread per core."""
    return max(1, available_cpus() // max(1, num_local_ranks))


def cpu_threads(requested: int | None, per_rank: int | None) -> int:
    """Intra-op threads for a CPU worker: ``requested`` (``device.cpu_threads``) when set; else
    ``OMP_NUM_THREADS`` when the user set it; else ``per_rank`` (the executor's share of the
    cores among its local ranks); else every core of the process's affinity mask."""
    if requested is not None:
        return requested
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return per_rank or available_cpus()


GLIBC_MALLOC_OPTIONS = {"TRIM_THRESHOLD": (-1, 512 << 20), "TOP_PAD": (-2, 64 << 20), "MMAP_THRESHOLD": (-3, 32 << 20)}
"""glibc ``mallopt`` parameters (name: (M_ constant, bytes)) for a CPU worker, see ``keep_freed_pages``."""


def keep_freed_pages() -> bool:
    """Make glibc's malloc reuse a CPU worker's freed activations instead of returning them to the OS.

    By default buffers of a few MB and up (a prefill step's activations) are fresh ``mmap`` pages each
    step, which the kernel faults in and zeroes: on the 12-layer CPU benchmark, 0.15-0.2 of its ~6.1 CPU
    s were such system time, 0.01-0.04 s with these options (benchmarks/RESULTS.md). Buffers under 32
    MB come from the heap, which keeps up to 512 MB of freed memory at its top. What is kept is at
    most the activations' peak, which the KV-cache budget already leaves room for. Skipped (False)
    where the user set any ``MALLOC_*_`` variable of these, or off glibc (no ``mallopt``: another
    allocator, e.g. a preloaded tcmalloc or jemalloc, keeps its own pages)."""
    if any(f"MALLOC_{name}_" in os.environ for name in GLIBC_MALLOC_OPTIONS):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all([mallopt(param, value) == 1 for param, value in GLIBC_MALLOC_OPTIONS.values()])


CPU_WORKER_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
"""What a spawned CPU process (a tp rank, the engine process) gets unless the user set it: OpenMP threads
that sleep at a barrier instead of spinning. On a 2-core machine under load, 2 threads spent 42.9 CPU s
spinning where passive ones spent 7.7 s for the same run (benchmarks/RESULTS.md). OpenMP reads it when
it starts, so it cannot change for a process already running torch."""


@contextmanager
def spawn_env(device_type: str) -> Iterator[None]:
    """Around the start of child processes: ``CPU_WORKER_ENV`` in the environment they inherit where the
    device is the CPU and the user set none of its names; this process's own environment restored after."""
    added = {k: v for k, v in CPU_WORKER_ENV.items() if k not in os.environ} if device_type == "cpu" else {}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def retry_on_address_in_use(start: Callable[[], None], stop: Callable[[], None], what: str, tries: int = 3) -> None:
    """Run ``start`` (spawn ranks and rendezvous); when it fails because the chosen
    port was taken meanwhile, ``stop`` the ranks and try again with a new port.
    Any other failure is raised at once."""
    for attempt in range(1, tries + 1):
        try:
            start()
            return
        except RuntimeError as err:
            stop()
            if not is_address_in_use(str(err)):
                raise
            if attempt == tries:
                raise RuntimeError(f"{what}: the rendezvous port was already in use on {tries} tries: {err}") from err
            logger.warning("%s: rendezvous port already in use; retrying with another (%s)", what, err)

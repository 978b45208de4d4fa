"""One GPU per trial when a parallel launcher runs several trials on one machine.

    python -m minivllm -m +tune=serving hydra/launcher=joblib hydra.launcher.n_jobs=4 \\
        hydra.sweeper.n_jobs=4 tune.devices=4

With ``tune.devices=N`` the first trial in each worker process claims one of the
devices 0..N-1 (an exclusive lock on a file per device in the sweep folder, held
for the life of the process) and narrows ``CUDA_VISIBLE_DEVICES`` to it, so its
engine, and every later trial in that process, sees only that device. The variable
must be set before the process first touches CUDA: true of the joblib launcher's
fresh worker processes; the basic launcher runs trials one by one in the main
process and needs no claim.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

_claim: tuple[int, IO] | None = None


def claim_device(count: int, lock_dir: Path) -> int:
    """This process's device index among ``count`` (claimed once, then kept)."""
    global _claim
    if _claim is not None:
        return _claim[0]
    lock_dir.mkdir(parents=True, exist_ok=True)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(count)]
    if len(ids) < count:
        raise ValueError(f"tune.devices={count}: CUDA_VISIBLE_DEVICES={visible} names only {len(ids)} devices")
    for index in range(count):
        handle = open(lock_dir / f"device{index}.lock", "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        _claim = (index, handle)
        os.environ["CUDA_VISIBLE_DEVICES"] = ids[index]
        return index
    raise RuntimeError(
        f"tune.devices={count}: every device is taken by another trial process; "
        "run at most tune.devices trials at once (hydra.launcher.n_jobs)"
    )


def release_memory() -> None:
    """After a trial failed (out of memory, a half-built engine): free what its objects held, so
    that the next trial in this process finds the device's memory as the first one did."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()

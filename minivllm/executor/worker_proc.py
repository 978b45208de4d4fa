"""The loop a spawned worker process runs, and the messages it exchanges with the driver.

One duplex pipe per rank. The driver sends the same bytes to every rank: a
pickled ``(seq, call)``, where ``call`` is the cloudpickled ``(method, args, kwargs)``
(so a user's lambda travels too; pickled apart, so that a call the worker
cannot unpickle still gets a reply).
The worker runs it and answers with a ``Reply`` carrying the same ``seq``, so
the driver can drop replies to a call it stopped waiting for (Ctrl-C). The
first reply (``seq`` 0), sent before any request, says whether the Worker could
be built. A ``None`` call asks the worker to shut down.

A worker ignores SIGINT: Ctrl-C reaches the whole process group, and it is the
driver's to handle (it then stops the workers). A worker whose driver has gone
(killed without a chance to clean up) exits on its own within a second.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing import util as mp_util
from multiprocessing.connection import Connection
from typing import Any

from minivllm.config.vllm_config import VllmConfig
from minivllm.executor.base import run_method
from minivllm.worker.extension import build_worker

SHUTDOWN = pickle.dumps((-1, None))


@dataclass
class Reply:
    seq: int
    ok: bool
    value: Any = None
    """The result when ``ok``; otherwise ``"ExceptionType: message"``."""
    traceback: str = ""


def error_reply(seq: int, err: BaseException) -> Reply:
    return Reply(seq, False, f"{type(err).__name__}: {err}", traceback.format_exc())


def worker_main(
    cfg: VllmConfig, rank: int, init_method: str, num_threads: int, conn: Connection, parent_pid: int
) -> None:
    """Entry point of a worker process (``multiprocessing`` spawn target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent(parent_pid)
    try:
        worker = build_worker(cfg, rank=rank, distributed_init_method=init_method, num_threads=num_threads)
    except BaseException as err:
        conn.send(error_reply(0, err))
        _exit_now(1)
    conn.send(Reply(0, True))
    try:
        _serve(worker, conn)
    finally:
        worker.shutdown()
        conn.close()
        _exit_now(0)


def _exit_now(code: int) -> None:
    """Skip the interpreter's teardown: with torch and transformers loaded it
    takes seconds, and the worker has released what it holds. multiprocessing's
    own exit hook still runs (it releases the semaphores tqdm and others made)."""
    mp_util._exit_function()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _serve(worker: Any, conn: Connection) -> None:
    while True:
        try:
            seq, call = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the driver closed the pipe or died
            return
        if call is None:
            return
        try:
            method, args, kwargs = pickle.loads(call)
            reply = Reply(seq, True, run_method(worker, method, args, kwargs))
        except BaseException as err:
            reply = error_reply(seq, err)
        try:
            conn.send(reply)
        except (BrokenPipeError, EOFError, OSError):
            return
        except Exception as err:  # the result did not pickle
            conn.send(error_reply(seq, err))


def _exit_with_parent(parent_pid: int, interval: float = 0.5) -> None:
    """Exit when the driver is gone, even in the middle of a collective that will never finish."""

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="minivllm-parent-watch", daemon=True).start()

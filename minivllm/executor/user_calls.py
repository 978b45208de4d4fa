"""Users' own calls to every worker: ``LLM.collective_rpc`` and ``LLM.apply_model``.

A user's function runs in each worker as ``fn(worker, *args, **kwargs)`` (a
method name runs ``worker.<name>(*args, **kwargs)``). The executors ship it with
``cloudpickle``, so lambdas and closures reach worker processes too.

Unlike the engine's own calls, a user's call that raises does not stop the
engine: each worker catches the error and sends it back as a ``RemoteError``
value, and the driver raises one ``RuntimeError`` naming the rank(s) once
every rank has answered. (A function that blocks forever in a collective
one rank never joins blocks the engine; that one is the caller's to avoid.)
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

from minivllm.executor.base import run_method


@dataclass(frozen=True)
class RemoteError:
    """What a user's call raised on one rank."""

    rank: int
    message: str
    """``"ExceptionType: message"``."""
    traceback: str


def run_user_call(worker: Any, method: str | Callable, args: tuple, kwargs: dict | None) -> Any:
    """Runs in a worker: the call's result, or a ``RemoteError`` instead of raising."""
    try:
        return run_method(worker, method, args, kwargs)
    except Exception as err:
        return RemoteError(getattr(worker, "rank", 0), f"{type(err).__name__}: {err}", traceback.format_exc())


def apply_to_model(worker: Any, fn: Callable[[nn.Module], Any]) -> Any:
    """Runs in a worker: ``fn`` applied to this rank's model."""
    return fn(worker.get_model())


def describe(method: str | Callable) -> str:
    return method if isinstance(method, str) else getattr(method, "__qualname__", repr(method))


def raise_remote_errors(method: str | Callable, results: list[Any]) -> list[Any]:
    """``results`` unchanged, unless a rank raised: then a RuntimeError naming each such rank."""
    errors = [r for r in results if isinstance(r, RemoteError)]
    if not errors:
        return results
    ranks = ", ".join(str(e.rank) for e in errors)
    first = errors[0]
    raise RuntimeError(
        f"collective_rpc({describe(method)}): worker rank {first.rank} raised {first.message}"
        + (f" (ranks that raised: {ranks})" if len(errors) > 1 else "")
        + f"\n--- rank {first.rank}'s traceback ---\n{first.traceback}"
    )


def user_collective_rpc(
    executor: Any, method: str | Callable, args: tuple = (), kwargs: dict | None = None
) -> list[Any]:
    """One result per rank, in rank order; a rank's error raises RuntimeError naming it."""
    if not (isinstance(method, str) or callable(method)):
        raise ValueError(f"collective_rpc: method={method!r} must be a Worker method name or a callable")
    if not isinstance(args, (tuple, list)):
        raise ValueError(f"collective_rpc: args={args!r} must be a tuple")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ValueError(f"collective_rpc: kwargs={kwargs!r} must be a dict or None")
    results = executor.collective_rpc(run_user_call, (method, tuple(args), kwargs))
    return raise_remote_errors(method, results)

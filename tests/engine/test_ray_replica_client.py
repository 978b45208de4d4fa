"""``RayReplicaClient`` notices a replica actor that dies while idle, as an engine process's reader
notices end-of-file: its driver checks the actor after ``idle_check_s`` without a command. A stand-in
for Ray (calls run in place; a dead actor raises Ray's error type) keeps this fast; the real actors
are tested in tests/ray/test_multinode.py."""

from __future__ import annotations

import threading
import time

from minivllm.engine.messages import AbortRequests, EngineReady
from minivllm.engine.ray_replica import RayReplicaClient


class _ActorDied(Exception):
    pass


class _FakeRay:
    class exceptions:
        RayError = _ActorDied

    @staticmethod
    def get(ref):
        return ref()  # a "reference" is the call itself

    @staticmethod
    def is_initialized() -> bool:
        return False  # nothing to kill


class _Method:
    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args):
        return lambda: self.fn(*args)


class _Actor:
    def __init__(self) -> None:
        self.alive = True
        self.runs: list[list] = []
        self.where = _Method(lambda: ("f00dfeed" * 4, "10.0.0.7", 4321))
        self.start = _Method(lambda: EngineReady(kv_spec=None))
        self.run = _Method(self._run)

    def _run(self, commands: list):
        if not self.alive:
            raise _ActorDied("The actor died unexpectedly before finishing this task.")
        self.runs.append(commands)
        return [], True, False  # no message, go on, nothing unfinished


def test_an_idle_replica_whose_actor_dies_is_reported_within_the_idle_check():
    actor, exited = _Actor(), threading.Event()
    reasons: list[str] = []
    on_exit = lambda reason: (reasons.append(reason), exited.set())  # noqa: E731
    client = RayReplicaClient(_FakeRay(), actor, lambda msg, now: None, on_exit, idle_check_s=0.02)
    assert (client.node_ip, client.pid) == ("10.0.0.7", 4321)
    client.send(AbortRequests(["r1"]))
    assert _wait(lambda: [AbortRequests(["r1"])] in actor.runs)  # a command goes out as before
    assert _wait(lambda: actor.runs.count([]) >= 2)  # idle: empty runs check the actor
    assert client.is_alive() and not exited.is_set()
    actor.alive = False
    assert exited.wait(5), "the idle replica's death went unnoticed"
    assert reasons == [
        "Ray actor on node f00dfeedf00d (10.0.0.7) died: The actor died unexpectedly before finishing this task."
    ]
    assert _wait(lambda: not client.is_alive())


def _wait(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True

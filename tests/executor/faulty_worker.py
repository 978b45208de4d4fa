"""A Worker that fails on rank 1 at its first model step (for the fault tests)."""

from __future__ import annotations

from minivllm.worker.worker import Worker


class FailingWorker(Worker):
    def execute_model(self, sched):
        if self.rank == 1 and not sched.is_empty:
            raise ValueError("injected fault on rank 1")
        return super().execute_model(sched)

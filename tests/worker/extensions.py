"""Worker extensions for the tests (importable by qualified name from worker processes too)."""

from __future__ import annotations

import os


class RankInfo:
    """Reads the worker it is mixed into."""

    def rank_and_pid(self) -> tuple[int, int]:
        return self.rank, os.getpid()

    def norm_weight_sum(self) -> float:
        return float(self.model_runner.model.model.norm.weight.sum())


class Clashing:
    def execute_model(self, sched):  # the worker's own method
        raise AssertionError("never called")

    def sleep(self, level: int = 1) -> None:
        raise AssertionError("never called")


class NotAClass:  # the module's function below is what the bad config names
    pass


def not_a_class() -> None:
    pass

"""The ``task`` group: what ``python -m minivllm`` does with the config (generate, bench, serve)."""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.config.validation import check_choice

TASKS = ("generate", "bench", "serve")


@dataclass
class TaskConfig:
    """What `python -m minivllm` does."""

    name: str = "generate"
    """What ``python -m minivllm`` does: generate, bench or serve."""

    def __post_init__(self) -> None:
        check_choice("task.name", self.name, TASKS)

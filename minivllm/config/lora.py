"""The ``lora`` config group (vLLM's names), and the ``serve.lora_modules`` list it serves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from minivllm.config.model import check_range


@dataclass
class LoRAConfig:
    """Multi-LoRA serving: adapter slots on the device and adapters kept on the host."""

    enable_lora: bool = False
    """Serve LoRA adapters (requests name one with a LoRARequest); off costs nothing per step."""
    max_loras: int = 1
    """Adapter slots on the device: the most distinct adapters in one step."""
    max_lora_rank: int = 16
    """Largest adapter rank accepted; slot tensors are sized for it."""
    max_cpu_loras: Optional[int] = None
    """Adapters kept loaded on the host (LRU); null: max_loras."""

    def __post_init__(self) -> None:
        check_range("lora.max_loras", self.max_loras, low=1)
        check_range("lora.max_lora_rank", self.max_lora_rank, low=1)
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"lora.max_cpu_loras={self.max_cpu_loras}: must be at least lora.max_loras={self.max_loras} (or null)"
            )

    @property
    def cpu_capacity(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras


def parse_lora_modules(modules: list[str]) -> list[tuple[str, str]]:
    """``["name=path", ...]`` -> [(name, path)]; ValueError naming serve.lora_modules otherwise."""
    pairs = []
    for item in modules:
        name, sep, path = str(item).partition("=")
        if not sep or not name or not path:
            raise ValueError(f"serve.lora_modules: {item!r} must be name=path")
        pairs.append((name, path))
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names):
        raise ValueError(f"serve.lora_modules: adapter names must be unique, got {names}")
    return pairs

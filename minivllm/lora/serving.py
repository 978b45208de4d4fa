"""The server's adapters: names the ``model`` field may choose, each bound to a LoRARequest.

Adapters named at start-up (``serve.lora_modules=[name=path, ...]``) and those
loaded at run time (``/v1/load_lora_adapter``, with
``serve.enable_lora_runtime_updates``) get fresh ``lora_int_id`` values that are
never reused, so an unloaded adapter's cached blocks and slots are never read
for another one; they age out of the LRU caches.
"""

from __future__ import annotations

import itertools
from typing import Callable

from minivllm.config.lora import parse_lora_modules
from minivllm.lora_request import LoRARequest


class ServedAdapters:
    """Adapter name -> LoRARequest; ``check`` validates an adapter before it is served."""

    def __init__(self, modules: list[str], base_name: str, check: Callable[[LoRARequest], None]) -> None:
        self.base_name = base_name
        self.check = check
        self._ids = itertools.count(1)
        self.by_name: dict[str, LoRARequest] = {}
        for name, path in parse_lora_modules(modules):
            self.load(name, path)

    def load(self, name: str, path: str) -> LoRARequest:
        if name == self.base_name or name in self.by_name:
            raise ValueError(f"lora_name={name!r}: already served")
        lora = LoRARequest(name, next(self._ids), path)
        self.check(lora)
        self.by_name[name] = lora
        return lora

    def unload(self, name: str) -> None:
        if self.by_name.pop(name, None) is None:
            raise KeyError(name)

"""The worker side of LoRA: host-side adapter cache, device slots (LRU), per-step token slots.

Invariant: the scheduler never runs more distinct adapters in one step than
there are slots, so every adapter a step needs can be made resident: a missing
one takes a free slot, else the least recently used slot whose adapter this
step does not need (an eviction).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
from torch import nn
from transformers import PretrainedConfig

from minivllm.config.lora import LoRAConfig
from minivllm.lora.layers import MEMBERS, wrap_lora_layers
from minivllm.lora.peft_loader import LoRAAdapter, load_peft_adapter
from minivllm.lora.punica import LoRAStepContext
from minivllm.lora_request import LoRARequest
from minivllm.request import RequestId


class LoRAModelManager:
    def __init__(
        self, model: nn.Module, cfg: LoRAConfig, hf_config: PretrainedConfig, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.cfg, self.hf_config, self.device = cfg, hf_config, device
        self.ctx = LoRAStepContext()
        self.layers = wrap_lora_layers(model, self.ctx, cfg.max_loras, cfg.max_lora_rank, dtype, device)
        self.host: OrderedDict[int, LoRAAdapter] = OrderedDict()
        """Adapters read from disk, most recently used last (at most ``cfg.cpu_capacity``)."""
        self.slots: OrderedDict[int, int] = OrderedDict()
        """Adapter id -> device slot, most recently used last."""
        self.requests: dict[RequestId, LoRARequest] = {}
        self.num_loads = 0
        self.num_evictions = 0

    # ---- requests --------------------------------------------------------------------
    def add_request(self, req_id: RequestId, lora: LoRARequest | None) -> None:
        if lora is not None:
            self.requests[req_id] = lora

    def remove_request(self, req_id: RequestId) -> None:
        self.requests.pop(req_id, None)

    # ---- one step --------------------------------------------------------------------
    def prepare_step(self, req_ids: list[RequestId], query_lens: np.ndarray) -> None:
        """Make the adapters of ``req_ids`` resident and give every token its slot.

        req_ids: the step's requests in token order; query_lens: (B,) their token counts.
        """
        loras = [self.requests.get(r) for r in req_ids]
        needed = {lora.lora_int_id: lora for lora in loras if lora is not None}
        if len(needed) > self.cfg.max_loras:
            raise RuntimeError(f"{len(needed)} adapters in one step, more than lora.max_loras={self.cfg.max_loras}")
        for lora in needed.values():
            self._make_resident(lora, needed)
        slot_of = self.slots
        row_slots = np.fromiter((-1 if lo is None else slot_of[lo.lora_int_id] for lo in loras), np.int64, len(loras))
        self.ctx.set_token_slots(np.repeat(row_slots, query_lens), self.device)

    def _make_resident(self, lora: LoRARequest, needed: dict[int, LoRARequest]) -> None:
        lid = lora.lora_int_id
        if lid in self.slots:
            self.slots.move_to_end(lid)
            return
        if len(self.slots) < self.cfg.max_loras:
            slot = len(self.slots)
        else:
            victim = next(v for v in self.slots if v not in needed)
            slot = self.slots.pop(victim)
            self.num_evictions += 1
        self._write_slot(slot, self._host_adapter(lora))
        self.slots[lid] = slot
        self.num_loads += 1

    def _host_adapter(self, lora: LoRARequest) -> LoRAAdapter:
        adapter = self.host.get(lora.lora_int_id)
        if adapter is None:
            adapter = load_peft_adapter(lora, self.hf_config, self.cfg.max_lora_rank)
            self.host[lora.lora_int_id] = adapter
            while len(self.host) > self.cfg.cpu_capacity:
                self.host.popitem(last=False)
        self.host.move_to_end(lora.lora_int_id)
        return adapter

    def _write_slot(self, slot: int, adapter: LoRAAdapter) -> None:
        for (layer, module), wrapper in self.layers.items():
            wrapper.set_slot(slot, [adapter.weights.get((layer, m)) for m in MEMBERS[module]])

    def clear_step(self) -> None:
        """Base model only (e.g. a profiling run)."""
        self.ctx.groups = []

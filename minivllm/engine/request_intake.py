"""The request half the offline engines share: ``add_request`` is ``process`` (tokenize
and check, in the front end, once) then ``add_processed`` (queue it; each engine its
own way: its core in this process, or a data-parallel replica)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from minivllm.engine.processor import ProcessedRequest, Processor, PromptType
from minivllm.lora_request import LoRARequest
from minivllm.pooling.params import PoolingParams
from minivllm.sampling_params import SamplingParams


class RequestIntake(ABC):
    processor: Processor

    def add_request(
        self,
        request_id: str | None,
        prompt: PromptType,
        params: SamplingParams | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        group_id: str | None = None,
        pooling_params: PoolingParams | None = None,
        lora_request: LoRARequest | None = None,
    ) -> str:
        """Validate and queue a request (``params.n`` core requests); raises ValueError
        (nothing queued) on bad input.

        ``cache_salt``: only requests with the same salt share prefix-cache blocks.
        ``group_id``: the client request it is part of (a server's request with several
        prompts); the scheduler takes turns between groups. Default: its own id.
        ``pooling_params``: a pooling request (model.runner=pooling) instead of ``params``.
        ``lora_request``: the adapter to run under (needs ``lora.enable_lora``).
        """
        params = pooling_params if pooling_params is not None else params
        request = self.process(request_id, prompt, params, priority, cache_salt, group_id, lora_request)
        return self.add_processed(request)

    def process(
        self,
        request_id: str | None,
        prompt: PromptType,
        params: SamplingParams | PoolingParams | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        group_id: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> ProcessedRequest:
        """``Processor.process`` under a new id of this engine's when ``request_id`` is None; queues nothing."""
        return self.processor.process(
            request_id,
            prompt,
            params,
            lora_request=lora_request,
            priority=priority,
            cache_salt=cache_salt,
            group_id=group_id,
        )

    @abstractmethod
    def add_processed(self, request: ProcessedRequest) -> str:
        """Queue a request ``process`` made; nothing is tokenized or checked again."""

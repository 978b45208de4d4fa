"""What every route handler needs: the engine, the served names and adapters, the chat
template, the checkpoint's sampling defaults and the tokenizer's bounds."""

from __future__ import annotations

import itertools
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from minivllm.config.load import generation_defaults
from minivllm.config.lora import parse_lora_modules
from minivllm.config.task import served_model_names
from minivllm.config.vllm_config import VllmConfig
from minivllm.engine.async_llm import AsyncLLM
from minivllm.lora_request import LoRARequest
from minivllm.multimodal.media import MediaConnector
from minivllm.serve.errors import ModelNotFound
from minivllm.serve.metrics import ServerMetrics
from minivllm.serve.protocol import ModelCard

OPEN_PATHS = frozenset({"/health", "/ping", "/version", "/metrics", "/openapi.json"})
"""What answers without the key when ``serve.api_key`` is set: probes, the version, metrics and
the schema. Every other route wants it (the /v1 routes; /tokenize, which renders and fetches
images; every route that changes state), so nothing is fetched or changed for a caller without it."""


class ServedAdapters:
    """Adapter name -> LoRARequest; ``check`` validates an adapter before it is served.

    The server's adapters: names the ``model`` field may choose, each bound to a LoRARequest.

    Adapters named at start-up (``serve.lora_modules=[name=path, ...]``) and those
    loaded at run time (``/v1/load_lora_adapter``, with
    ``serve.enable_lora_runtime_updates``) get fresh ``lora_int_id`` values that are
    never reused, so an unloaded adapter's cached blocks and slots are never read
    for another one; they age out of the LRU caches.
    """

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


class ServerState:
    def __init__(self, engine: AsyncLLM, cfg: VllmConfig) -> None:
        self.engine = engine
        self.cfg = cfg
        self.model_names = served_model_names(cfg.serve.served_model_name, cfg.model.path)
        """Every name the model answers to; the first is reported in responses."""
        self.model_name = self.model_names[0]
        self.api_key = cfg.serve.api_key
        self.default_sampling_params = generation_defaults(cfg.model.generation_config, cfg.checkpoint_dir)
        """The checkpoint's generation config: defaults for the sampling fields a request leaves out."""
        self.chat_template = load_chat_template(cfg.serve.chat_template) or getattr(
            engine.tokenizer, "chat_template", None
        )
        self.adapters = ServedAdapters(list(cfg.serve.lora_modules), self.model_name, engine.processor.lora.check)
        """LoRA adapters the ``model`` field may name besides the base model."""
        self.media = MediaConnector.for_config(cfg)
        """Loads chat images under the server's media rules; its fetcher caps the fetches in flight."""
        self.metrics = ServerMetrics(self.model_name, cfg.serve.metrics_prefix)
        engine.stat_loggers.append(self.metrics)
        self.token_text = lru_cache(maxsize=65536)(self._token_text)
        self.max_token_chars = longest_token_chars(engine.tokenizer)
        """No token of the tokenizer is longer (admission.check_text_length bounds prompts with it)."""

    def check_model(self, model: str | None) -> LoRARequest | None:
        """The adapter ``model`` names (None: the base model, under any served name); 404 for a name not served."""
        if model is None or model in self.model_names:
            return None
        lora = self.adapters.by_name.get(model)
        if lora is None:
            raise ModelNotFound(model, ", ".join([*self.model_names, *self.adapters.by_name]))
        return lora

    def shown_model(self, model: str | None) -> str:
        """The name responses report: the adapter's when ``model`` chose one, else the first served name."""
        return model if model is not None and model in self.adapters.by_name else self.model_name

    def _token_text(self, token_id: int) -> str:
        return self.engine.tokenizer.decode([token_id])

    def detokenize(self, token_ids: list[int]) -> str:
        return self.engine.tokenizer.decode(token_ids)

    def model_cards(self) -> list[ModelCard]:
        """/v1/models: every served name of the base model, then each LoRA adapter."""
        root, max_len = self.cfg.model.path, self.cfg.max_model_len
        cards = [ModelCard(id=name, root=root, max_model_len=max_len) for name in self.model_names]
        adapters = [
            ModelCard(id=name, root=lora.lora_path, parent=self.model_name, max_model_len=max_len)
            for name, lora in self.adapters.by_name.items()
        ]
        return [*cards, *adapters]


UNKNOWN_TOKEN_CHARS = 1 << 20
"""Used when the vocabulary cannot be read as strings: the bound then only stops absurd texts."""


def longest_token_chars(tokenizer: Any) -> int:
    """Characters in the tokenizer's longest token (added tokens included), as its vocabulary
    spells it: byte-level ``Ġ`` and SentencePiece ``▁`` stand for one character each, and a
    byte token for at most one, so no token decodes to more characters than this."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    lengths = [len(t) for t in tokens if isinstance(t, (str, bytes))]
    return max(lengths) if lengths else UNKNOWN_TOKEN_CHARS


def load_chat_template(value: str | None) -> str | None:
    """serve.chat_template is a Jinja string or a file holding one."""
    if not value:
        return None
    if "{" in value or "\n" in value:
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"serve.chat_template={value!r}: no such file, and not a Jinja template")
    return path.read_text()

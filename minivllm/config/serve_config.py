"""The ``serve`` group: the HTTP server of task=serve."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from minivllm.config.lora import parse_lora_modules
from minivllm.config.served_names import check_served_model_name
from minivllm.config.validation import check_range

TOOL_CALL_PARSERS = ("hermes", "llama3_json")
REASONING_PARSERS = ("deepseek_r1", "qwen3")
METRICS_PREFIX = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
"""What a Prometheus metric name may start with (the prefix is joined to vLLM's names by a colon)."""


@dataclass
class ServeConfig:
    """The HTTP server of task=serve."""

    host: str = "127.0.0.1"
    """Address the HTTP server binds."""
    port: int = 8000
    """Port the HTTP server binds."""
    api_key: Optional[str] = None
    """When set, every /v1 route needs ``Authorization: Bearer <api_key>``."""
    served_model_name: Optional[Any] = None
    """Model name(s) the server answers to: a name, a list (``[a,b]``) or comma-separated names; the first
    is reported. Defaults to model.path (``demo`` for the bundled demo model)."""
    chat_template: Optional[str] = None
    """Jinja chat template (or a file holding one) for models whose tokenizer has none."""
    shutdown_timeout: float = 30.0
    """Seconds in-flight requests get to finish after SIGTERM before they are cancelled."""
    max_n: int = 128
    """Most completions one prompt may ask for (``n``); more is a 400. ``LLM`` checks it too."""
    max_seqs_per_request: int = 1024
    """Most sequences (prompts x n) one HTTP request may queue; more is a 400."""
    max_waiting: int = 2048
    """Sequences allowed to wait beyond scheduler.max_num_seqs; a request that would go past it gets 503."""
    tool_call_parser: Optional[str] = None
    """How tool calls are read from chat output for tool_choice=auto: hermes or llama3_json."""
    reasoning_parser: Optional[str] = None
    """Split <think>...</think> into reasoning_content: deepseek_r1 or qwen3."""
    lora_modules: list[str] = field(default_factory=list)
    """LoRA adapters served from the start, as name=path; a request picks one by its ``model`` field."""
    enable_lora_runtime_updates: bool = False
    """Offer /v1/load_lora_adapter and /v1/unload_lora_adapter."""
    max_request_bytes: int = 16 * 1024 * 1024
    """Largest request body accepted; a bigger one is a 413 before it is read (or as soon as it goes past)."""
    header_timeout: float = 30.0
    """Seconds a connection may take to send a request's headers (from its start or the previous answer)."""
    body_timeout: float = 60.0
    """Seconds the server waits for the next piece of a request body before it answers 408 and closes."""
    keep_alive_timeout: float = 5.0
    """Seconds an idle keep-alive connection stays open between requests."""
    max_header_bytes: int = 64 * 1024
    """Largest request line plus headers; more is a 400 and the connection closes."""
    dev_mode: bool = False
    """Offer development routes: /sleep, /wake_up, /is_sleeping (vLLM's VLLM_SERVER_DEV_MODE); never on a public port."""
    metrics_prefix: str = "vllm"
    """Namespace of the /metrics names and LLM.get_metrics() (``vllm`` gives vLLM's ``vllm:prompt_tokens_total``)."""

    def __post_init__(self) -> None:
        check_range("serve.port", self.port, low=0, high=65535)
        check_metrics_prefix(self.metrics_prefix)
        check_served_model_name(self.served_model_name)
        check_range("serve.shutdown_timeout", self.shutdown_timeout, low=0.0)
        check_range("serve.max_n", self.max_n, low=1)
        parse_lora_modules(list(self.lora_modules))
        check_range("serve.max_seqs_per_request", self.max_seqs_per_request, low=1)
        check_range("serve.max_waiting", self.max_waiting, low=0)
        check_range("serve.max_request_bytes", self.max_request_bytes, low=1024)
        check_range("serve.max_header_bytes", self.max_header_bytes, low=1024)
        for key in ("header_timeout", "body_timeout", "keep_alive_timeout"):
            check_range(f"serve.{key}", getattr(self, key), low=0.0, low_open=True)
        for key, allowed in (("tool_call_parser", TOOL_CALL_PARSERS), ("reasoning_parser", REASONING_PARSERS)):
            value = getattr(self, key)
            if value is not None and value not in allowed:
                raise ValueError(f"serve.{key}={value!r}: must be one of {', '.join(allowed)} (or null)")


def check_metrics_prefix(prefix: object) -> None:
    if not isinstance(prefix, str) or not METRICS_PREFIX.fullmatch(prefix):
        raise ValueError(
            f"serve.metrics_prefix={prefix!r}: must be a Prometheus name prefix "
            "(letters, digits, '_' or ':', not starting with a digit), e.g. vllm"
        )


def metric_name(prefix: str, name: str) -> str:
    """``vllm`` + ``prompt_tokens`` -> ``vllm:prompt_tokens``."""
    return f"{prefix}:{name}"

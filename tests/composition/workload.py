"""The requests every cell of the composition matrix runs, and what each must satisfy.

The request options (n, seeded sampling, a stop string, logprobs, a grammar, a LoRA
adapter) are crossed pairwise too, so one ``generate`` call per engine covers every
engine option with every request option. Prompts share prefixes (prefix caching has
something to hit) and are all longer than a chunked step's budget.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

import jsonschema
from allpairspy import AllPairs

from minivllm import SamplingParams
from minivllm.lora import LoRARequest
from minivllm.structured_output import StructuredOutputsParams

PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "def fibonacci(n):\n    if n < 2:\n        return 1\n    return",
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
    "class Stack:\n    def push(self, x):\n        self.items.append(x)\n    def push(self, x):\n",
    "import os\nimport sys\nimport json\nimport re\n",
    "for line in open(path):\n    print(line)\nfor line in open(path):\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +",
    "with open(path) as f:\n    data = json.load(f)\n",
    "x = x + 1\ny = y + 1\nx = x + 1\ny = y + 1\nx = x",
    # the test model repeats one token after these two: n-gram drafts get accepted
    "class Stack:\n    def __init__(self):\n        self.items = []\n    def pop(self):\n",
    "return self.items\nreturn self.items\nreturn self",
    "class Stack:\n    def __init__(self):\n        self.items = []\n    def pop(self):\n",
    "import os\nimport sys\nimport os\nimport",
]

REQUEST_OPTIONS: dict[str, list[Any]] = {
    "structured": [None, "regex", "choice", "json"],
    "n": [1, 2],
    "seeded": [False, True],
    "stop": [False, True],
    "logprobs": [None, 2],
    "adapter": [False, True],
}
"""Option -> levels, the plain one first; ``adapter`` only takes effect on LoRA engines."""

MAX_TOKENS = 16
REGEX = r"[0-9]{3}-[a-z]{2}"
REGEX_PREFIX = r"[0-9]{0,3}|[0-9]{3}-[a-z]{0,2}"
CHOICES = ["alpha", "beta", "gamma"]
SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}},
    "required": ["id", "ok"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class RequestSpec:
    """One request of the workload: its option levels and, once probed, its stop string."""

    prompt: str
    levels: dict[str, Any]
    stop: str | None = None

    def params(self) -> SamplingParams:
        structured = self.levels["structured"]
        return SamplingParams(
            n=self.levels["n"],
            temperature=0.8 if self.levels["seeded"] else 0.0,
            seed=17 if self.levels["seeded"] else None,
            max_tokens=MAX_TOKENS * (2 if structured == "json" else 1),
            ignore_eos=structured is None,  # a grammar ends on EOS
            stop=[self.stop] if self.stop else None,
            logprobs=self.levels["logprobs"],
            structured_outputs=_grammar(structured),
        )

    def lora(self, adapter: str | None) -> LoRARequest | None:
        return LoRARequest("adapter", 1, adapter) if adapter and self.levels["adapter"] else None


def _grammar(kind: str | None) -> StructuredOutputsParams | None:
    if kind == "regex":
        return StructuredOutputsParams(regex=REGEX)
    if kind == "choice":
        return StructuredOutputsParams(choice=CHOICES)
    if kind == "json":
        return StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    return None


DRAFTED = [
    {"structured": None, "n": 1, "seeded": False, "stop": False, "logprobs": None, "adapter": False},
    {"structured": None, "n": 1, "seeded": False, "stop": True, "logprobs": None, "adapter": False},
    {"structured": None, "n": 1, "seeded": False, "stop": False, "logprobs": None, "adapter": True},
    {"structured": None, "n": 2, "seeded": True, "stop": False, "logprobs": None, "adapter": False},
]
"""Requests that n-gram speculation drafts for (no logprobs, no grammar: those decode one token
a step), on the repetitive prompts; the pairwise rows have few of them."""


def request_specs() -> list[RequestSpec]:
    """One request per pairwise row of ``REQUEST_OPTIONS``, then ``DRAFTED`` (stop strings not yet chosen)."""
    rows = [dict(zip(REQUEST_OPTIONS, row)) for row in AllPairs(list(REQUEST_OPTIONS.values()))] + DRAFTED
    assert len(rows) <= len(PROMPTS), len(rows)
    return [RequestSpec(prompt, levels) for prompt, levels in zip(PROMPTS, rows)]


def with_stops(specs: list[RequestSpec], probe_texts: list[str]) -> list[RequestSpec]:
    """Give each request that asks for a stop string one that occurs in ``probe_texts``
    (its output without one), so that the stop really triggers in the reference."""
    out = []
    for spec, text in zip(specs, probe_texts, strict=True):
        if spec.levels["stop"]:
            spec = replace(spec, stop=_stop_string(text))
        out.append(spec)
    return out


def _stop_string(text: str) -> str:
    """Two printable ASCII characters of ``text``, from its middle on if it has them there, else
    one (the test model's text also holds partial UTF-8 sequences, shown as U+FFFD until complete)."""
    starts = sorted(range(len(text)), key=lambda i: (i < len(text) // 2, i))
    for width in (2, 1):
        for i in starts:
            if len(text[i : i + width]) == width and _plain(text[i : i + width]):
                return text[i : i + width]
    raise AssertionError(f"no printable ASCII in {text!r}")


def _plain(piece: str) -> bool:
    return all(c.isascii() and c.isprintable() for c in piece)


def check_completion(spec: RequestSpec, completion: Any) -> None:
    """What holds of any completion of ``spec``, whatever the engine: the length bound,
    the stop string, and the grammar (whole, or a prefix when a stop string cut it)."""
    params = spec.params()
    tokens, text = list(completion.token_ids), completion.text
    assert 1 <= len(tokens) <= params.max_tokens, (spec, tokens)
    if completion.finish_reason == "length":
        assert len(tokens) == params.max_tokens
    if spec.stop:
        assert spec.stop not in text, (spec.stop, text)
    if params.logprobs is not None:
        assert len(completion.logprobs) == len(tokens)
        assert all(t in lp and len(lp) >= params.logprobs for t, lp in zip(tokens, completion.logprobs))
    if spec.levels["structured"]:
        cut = isinstance(completion.stop_reason, str)
        _check_grammar(spec.levels["structured"], text, complete=completion.finish_reason == "stop" and not cut)


def _check_grammar(kind: str, text: str, complete: bool) -> None:
    if kind == "regex":
        assert re.fullmatch(REGEX if complete else REGEX_PREFIX, text), text
    elif kind == "choice":
        assert text in CHOICES if complete else any(c.startswith(text) for c in CHOICES), text
    elif complete:
        jsonschema.validate(json.loads(text), SCHEMA)
    else:
        assert text.startswith('{"'), text

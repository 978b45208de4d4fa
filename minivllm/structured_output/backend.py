"""The grammar library behind structured outputs (xgrammar), and the step's bitmask on the logits.

xgrammar was chosen over llguidance on measured per-token mask cost with our
tokenizer (benchmarks/structured_output_mask.py, docs/structured_outputs.md):
filling a JSON-schema mask and advancing the matcher costs about a third of
llguidance's time at batch 1 and at batch 64. It is also vLLM's default.

The tokenizer's vocabulary is padded to the model's vocabulary size (the width
of the logits, ``hf_config.vocab_size``): ids past the tokenizer's last token
are never allowed.

A JSON schema's grammar has strict JSON strings, length-bounded ones included.
xgrammar's schema converter (0.2.8 and earlier) writes two kinds of string rule:

    "type": "string"                     basic_string_sub  ::= ... [^\\0-\\x1f\\"\\\\\\r\\n] ...
    "type": "string", "maxLength": 8     root_characters   ::= (([^\\"\\\\\\r\\n]))   repeated {0, 8}

The second class lets the raw control characters U+0000-U+001F other than CR
and LF (a tab, ``\\x15``) into the string, and strict JSON parsers refuse them
(RFC 8259, section 7): a model that samples one (a small or random model does,
often) writes output that ``json.loads`` rejects. ``strict_string_grammar``
prints the converted grammar as EBNF, narrows each such character rule to the
unbounded rule's class, and parses it back; the round trip is exact (the
printed grammar re-parses to the same text), so nothing else changes. The
character rule is matched as a whole rule line, so a constant or a pattern that
happens to spell the same class is left alone; a converter without the hole has
no such rule, and its grammar is used as it is.

Escapes stay out of length-bounded strings, as in xgrammar: such a string cannot
hold a quote, a backslash or a newline, even escaped.

The worker's side: the scheduler sends one bitmask row per request with a grammar
that samples in the step (``SchedulerOutput.grammar_bitmask`` and
``structured_output_request_ids``); the runner lays it out along the sampler's rows
(``bitmask_for_rows``) and the sampler masks its logits with it before any other
edit (``apply_grammar_bitmask``), so penalties, temperature and top-k/p see only the
allowed tokens. Logprobs stay those of the model's raw logits (finite for every
token), as without a grammar.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import torch

from minivllm.request import RequestId
from minivllm.structured_output_params import StructuredOutputsParams

_JSON_OBJECT_SCHEMA = {"type": "object"}
_COMPACT = (",", ":")
MAX_WHITESPACE = 16
"""Most whitespace characters between two JSON tokens: enough for pretty-printing,
and a small model cannot loop on newlines until max_tokens."""


def grammar_source(params: StructuredOutputsParams) -> tuple[str, Any]:
    """(how to build, what from): the library-independent recipe of ``params``."""
    kind = params.kind
    if kind == "choice":
        alternatives = " | ".join(json.dumps(c) for c in params.choice)
        return "ebnf", f"root ::= {alternatives}"
    if kind == "json_object":
        return "json", _JSON_OBJECT_SCHEMA
    if kind == "grammar":
        return "ebnf", params.grammar
    return kind, params.json if kind == "json" else params.regex


def check_grammar(params: StructuredOutputsParams) -> None:
    """Parse the constraint without a tokenizer (cheap), so a bad schema, regex or
    grammar is a ValueError naming the field before the request is queued."""
    import xgrammar as xgr

    how, source = grammar_source(params)
    try:
        if how == "json":
            xgr.Grammar.from_json_schema(json.dumps(source))
        elif how == "regex":
            xgr.Grammar.from_regex(source)
        else:
            xgr.Grammar.from_ebnf(source)
    except RuntimeError as err:
        detail = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise ValueError(f"structured_outputs.{params.kind}: cannot be compiled: {_strip_location(detail)}") from None
    except UnicodeDecodeError:  # xgrammar's message cut a non-ASCII character in two
        raise ValueError(
            f"structured_outputs.{params.kind}: cannot be compiled: a syntax error (near a non-ASCII character)"
        ) from None


def _strip_location(message: str) -> str:
    """xgrammar prefixes its messages with a timestamp and a C++ source location."""
    head, sep, tail = message.partition(": ")
    return tail if sep and (".cc:" in head or ".h:" in head) else message


_BOUNDED_CHARACTER_RULE = re.compile(r'^(\S+ ::= \(\()\[\^\\"\\\\\\r\\n\](\)\))$', re.MULTILINE)
"""``name ::= (([^\\"\\\\\\r\\n]))``: a length-bounded string's character, as xgrammar prints it."""
JSON_STRING_CHARACTER = r"[^\0-\x1f\"\\\r\n]"
"""One unescaped character of a JSON string, in xgrammar's EBNF (its unbounded rule's class)."""


def strict_string_grammar(schema: str, **options: Any) -> Any:
    """xgrammar's grammar of the JSON schema text ``schema`` (``options`` as for
    ``Grammar.from_json_schema``), with no raw control character allowed in any string."""
    import xgrammar as xgr

    grammar = xgr.Grammar.from_json_schema(schema, **options)
    text, holes = _BOUNDED_CHARACTER_RULE.subn(lambda m: m[1] + JSON_STRING_CHARACTER + m[2], str(grammar))
    return xgr.Grammar.from_ebnf(text) if holes else grammar


class XGrammarBackend:
    """Compiles grammars for one tokenizer and makes matchers for them."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.vocab_size = vocab_size
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, params: StructuredOutputsParams) -> Any:
        """A compiled grammar (slow: call it off the step loop)."""
        how, source = grammar_source(params)
        if how == "json":
            compact = params.disable_any_whitespace
            grammar = strict_string_grammar(
                json.dumps(source),
                any_whitespace=not compact,
                separators=_COMPACT if compact else None,
                max_whitespace_cnt=None if compact else MAX_WHITESPACE,
            )
            return self._compiler.compile_grammar(grammar)
        if how == "regex":
            return self._compiler.compile_regex(source)
        return self._compiler.compile_grammar(source)

    def matcher(self, compiled: Any) -> Any:
        return self._xgr.GrammarMatcher(compiled)

    def allocate_bitmask(self, rows: int) -> Any:
        """(rows, ceil(vocab / 32)) int32, all bits set."""
        return self._xgr.allocate_token_bitmask(rows, self.vocab_size)


def backend_for(cfg: Any) -> XGrammarBackend:
    """The backend for the configured model: its tokenizer, its logits width, its EOS ids."""
    from minivllm.tokenizer import get_tokenizer

    tokenizer = get_tokenizer(cfg)
    eos = getattr(cfg.hf_config, "eos_token_id", None)
    stop_ids = [eos] if isinstance(eos, int) else list(eos or [])
    if not stop_ids and tokenizer.eos_token_id is not None:
        stop_ids = [tokenizer.eos_token_id]
    return XGrammarBackend(tokenizer, cfg.hf_text_config.vocab_size, stop_ids)


def bitmask_for_rows(
    bitmask: np.ndarray | None, bitmask_req_ids: list[RequestId], row_req_ids: list[RequestId], device: torch.device
) -> torch.Tensor | None:
    """The step's bitmask laid out along the sampler's rows: (N, words) int32,
    all bits set on rows without a grammar; None when the step has no bitmask."""
    if bitmask is None:
        return None
    where = {r: i for i, r in enumerate(bitmask_req_ids)}
    out = np.full((len(row_req_ids), bitmask.shape[1]), -1, dtype=np.int32)  # (N, words)
    for row, req_id in enumerate(row_req_ids):
        i = where.get(req_id)
        if i is not None:
            out[row] = bitmask[i]
    return torch.from_numpy(out).to(device, non_blocking=True)


def apply_grammar_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits: (N, V) fp32, left unchanged; returns a copy where tokens whose bit is
    0 in their row of ``bitmask`` (N, ceil(V / 32)) are -inf."""
    import xgrammar as xgr

    masked = logits.clone()
    xgr.apply_token_bitmask_inplace(masked, bitmask.to(masked.device), vocab_size=masked.shape[-1])
    return masked

"""The grammar library behind structured outputs: xgrammar.

xgrammar was chosen over llguidance on measured per-token mask cost with our
tokenizer (benchmarks/structured_output_mask.py, docs/structured_outputs.md):
filling a JSON-schema mask and advancing the matcher costs about a third of
llguidance's time at batch 1 and at batch 64. It is also vLLM's default.

JSON schemas go through ``json_strings.py``, which keeps raw control characters
out of length-bounded strings (xgrammar lets them in).

The tokenizer's vocabulary is padded to the model's vocabulary size (the width
of the logits, ``hf_config.vocab_size``): ids past the tokenizer's last token
are never allowed.
"""

from __future__ import annotations

import json
from typing import Any

from minivllm.structured_output.json_strings import strict_string_grammar
from minivllm.structured_output.params import StructuredOutputsParams

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

"""A JSON schema's grammar whose strings are strict JSON, length-bounded ones included.

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
"""

from __future__ import annotations

import re
from typing import Any

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

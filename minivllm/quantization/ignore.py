"""Which linear layers a checkpoint left unquantized (``ignored_layers``, ``ignore``,
``modules_to_not_convert``)."""

from __future__ import annotations

import re


def is_ignored(prefix: str, members: list[str], patterns: list[str]) -> bool:
    """True when every checkpoint member of the layer matches a pattern.

    A pattern is a module name, a name fragment ending a module path (``lm_head``,
    ``mlp.down_proj``) or a regex prefixed ``re:`` (compressed-tensors). A fused
    layer (qkv) must be ignored for all of its members or for none.
    """
    if not patterns:
        return False
    hits = [any(_matches(name, p) for p in patterns) for name in members]
    if any(hits) and not all(hits):
        raise ValueError(f"{prefix}: fused layer with some members quantized and some not ({members}) is not supported")
    return all(hits)


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], name) is not None
    return f".{pattern}." in f".{name}."

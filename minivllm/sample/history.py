"""The tokens each sampling row has seen, which the history-reading logit edits share
(penalties, bad words, min_tokens, per-request logits processors)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenHistory:
    """``token_ids[i]``: row i's prompt (its first ``num_prompt_tokens[i]``) followed by its output so far."""

    token_ids: list[list[int]]
    num_prompt_tokens: list[int]

    def prompt(self, row: int) -> list[int]:
        return self.token_ids[row][: self.num_prompt_tokens[row]]

    def output(self, row: int) -> list[int]:
        return self.token_ids[row][self.num_prompt_tokens[row] :]

"""``Logprob``: one token's log-probability with its rank and text (vLLM's fields).

``Logprob`` is a ``float`` subclass: ``lp[token].logprob`` reads as in vLLM, and
code that treats the entry as a number (sums, comparisons, JSON) keeps working.
``rank`` is the token's 1-based position in the vocabulary sorted by probability
(ties share the better rank), also for a sampled or prompt token outside the
requested top-k: the worker counts the tokens more likely than it.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from minivllm.outputs import PositionLogprobs


class Logprob(float):
    """``Logprob(logprob, rank=None, decoded_token=None)``; compares and adds as its logprob."""

    def __new__(cls, logprob: float, rank: int | None = None, decoded_token: str | None = None) -> "Logprob":
        obj = super().__new__(cls, logprob)
        obj.rank = rank
        obj.decoded_token = decoded_token
        return obj

    @property
    def logprob(self) -> float:
        return float(self)

    def __reduce__(self):
        return (Logprob, (float(self), self.rank, self.decoded_token))

    def __repr__(self) -> str:
        return f"Logprob(logprob={float(self)!r}, rank={self.rank!r}, decoded_token={self.decoded_token!r})"


class LogprobBuilder:
    """Turns the workers' ``PositionLogprobs`` into ``{token_id: Logprob}``.

    A worker's dict holds the chosen token first, then the top-k in descending
    order; when the chosen token is one of the top-k it appears once. The
    chosen token's rank comes from the worker; the top-k's are their order.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def token_text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.tokenizer.decode([token_id])
        return text

    def entry(self, raw: PositionLogprobs, top_k: int, detokenize: bool) -> dict[int, Logprob]:
        """One position; ``top_k``: how many alternatives were asked for."""
        items = list(raw.token_logprobs.items())
        top = items[1:] if len(items) > top_k else items  # the chosen token is outside the top-k
        ranks = {t: r for r, (t, _) in enumerate(sorted(top, key=lambda kv: -kv[1]), start=1)}
        ranks[items[0][0]] = raw.rank
        return {t: Logprob(lp, ranks[t], self.token_text(t) if detokenize else None) for t, lp in items}

    def positions(
        self, raw: list[PositionLogprobs | None], top_k: int, detokenize: bool
    ) -> list[dict[int, Logprob] | None]:
        return [None if d is None else self.entry(d, top_k, detokenize) for d in raw]

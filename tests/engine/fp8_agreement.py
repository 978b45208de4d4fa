"""How closely greedy decoding over an fp8 KV cache follows the same model over its
full-precision cache, measured strictly.

Per prompt: the tokens identical to the reference's before the first divergence, and
at that divergence the reference's top-2 logprob gap (how close a tie the reference
itself was). At the positions before it (same context in both runs): how much the fp8
cache moved the chosen token's logprob and the top-2 gap.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PromptAgreement:
    agreed: int
    """Greedy tokens identical to the reference's before the first divergence."""
    total: int
    divergence_gap: float | None
    """The reference's top-2 logprob gap (nats) where the outputs first differ; None: they never do."""


@dataclass
class Agreement:
    prompts: list[PromptAgreement] = field(default_factory=list)
    logprob_shifts: list[float] = field(default_factory=list)
    """|fp8 - reference| logprob of the chosen token, at every agreeing position."""
    gap_shifts: list[float] = field(default_factory=list)
    """|fp8 - reference| top-2 logprob gap, at agreeing positions where both top-2 are the same tokens."""

    @property
    def strict(self) -> float:
        """Share of all greedy tokens identical to the reference's before each prompt's first divergence."""
        return sum(p.agreed for p in self.prompts) / sum(p.total for p in self.prompts)

    @property
    def max_gap_shift(self) -> float:
        return max(self.gap_shifts, default=0.0)

    def divergence_gaps(self) -> list[float]:
        return [p.divergence_gap for p in self.prompts if p.divergence_gap is not None]

    def report(self, name: str) -> str:
        per_prompt = " ".join(f"{p.agreed}/{p.total}" for p in self.prompts)
        gaps = ", ".join(f"{g:.3f}" for g in self.divergence_gaps()) or "none"
        mean_shift = sum(self.logprob_shifts) / max(1, len(self.logprob_shifts))
        return (
            f"{name}: strict agreement {self.strict:.1%} (per prompt {per_prompt}); "
            f"reference top-2 gap at divergences: {gaps} nat; chosen-token logprob shift mean "
            f"{mean_shift:.4f} max {max(self.logprob_shifts, default=0.0):.4f}; top-2 gap shift max {self.max_gap_shift:.4f}"
        )


def top2_gap(logprobs: dict) -> float:
    values = sorted((float(getattr(v, "logprob", v)) for v in logprobs.values()), reverse=True)
    return values[0] - values[1]


def measure(reference: list, fp8: list) -> Agreement:
    """``reference`` and ``fp8``: RequestOutputs of the same greedy requests with ``logprobs >= 2``."""
    result = Agreement()
    for ref_out, fp8_out in zip(reference, fp8, strict=True):
        ref, got = ref_out.outputs[0], fp8_out.outputs[0]
        n = len(ref.token_ids)
        first = next((i for i, (x, y) in enumerate(zip(ref.token_ids, got.token_ids)) if x != y), n)
        for pos in range(first):
            token = ref.token_ids[pos]
            result.logprob_shifts.append(abs(float(ref.logprobs[pos][token]) - float(got.logprobs[pos][token])))
            if _top2(ref.logprobs[pos]) == _top2(got.logprobs[pos]):
                result.gap_shifts.append(abs(top2_gap(ref.logprobs[pos]) - top2_gap(got.logprobs[pos])))
        gap = top2_gap(ref.logprobs[first]) if first < n else None
        result.prompts.append(PromptAgreement(first, n, gap))
    return result


def _top2(logprobs: dict) -> tuple[int, ...]:
    ranked = sorted(logprobs, key=lambda t: float(getattr(logprobs[t], "logprob", logprobs[t])), reverse=True)
    return tuple(ranked[:2])

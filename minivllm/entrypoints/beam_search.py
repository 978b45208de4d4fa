"""Beam search on top of ordinary engine requests, with transformers' rules.

Each round, every live beam of every prompt becomes one engine request for one
token with ``logprobs = 2 * beam_width`` (beams of one prompt share their prompt
blocks, and each other's, through the prefix cache). The candidates of a prompt
are its beams' top tokens; per round (``BeamSearch.advance``), as transformers'
``generate(num_beams=W, do_sample=False)`` does:

1. keep the best ``2W`` candidates by summed logprob;
2. those ending in EOS (or reaching max_tokens) among the best ``W`` of them
   finish with score ``sum_logprobs / generated_len ** length_penalty``; the
   best ``W`` finished are kept;
3. the best ``W`` candidates that did not finish are the next live beams;
4. the search stops when no candidate can go on, or when all ``W`` finished
   slots are full and the best live beam's score at its current length is no
   better than the worst finished one.

``run_beam_search`` drives the engine ``LLM`` holds (``LLMEngine`` or
``DataParallelEngine``) through the one admission path (``engine.processor.process``,
then ``engine.add_processed``) and returns the outputs to ``LLM.beam_search``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from minivllm.context_length import check_request_fits
from minivllm.data_parallel.engine import DataParallelEngine
from minivllm.engine.llm_engine import LLMEngine
from minivllm.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams

OfflineEngine = LLMEngine | DataParallelEngine


@dataclass
class BeamSearchSequence:
    """One beam: the prompt's and the generated tokens, and how it ended."""

    tokens: list[int]
    """Prompt token ids followed by the generated ones."""
    logprobs: list[dict[int, float]]
    """Per generated token, the logprobs of the candidates looked at (the chosen one among them)."""
    cum_logprob: float = 0.0
    """Sum of the generated tokens' logprobs."""
    score: float = 0.0
    """``cum_logprob / generated_len ** length_penalty`` (transformers' ``sequences_scores``)."""
    text: str | None = None
    """The decoded tokens (prompt included), as vLLM returns it."""
    finish_reason: str | None = None
    """'stop' (EOS) or 'length'."""
    stop_reason: int | str | None = None


@dataclass
class BeamSearchOutput:
    """The finished beams of one prompt, best first."""

    sequences: list[BeamSearchSequence]


@dataclass
class _Beam:
    tokens: list[int] = field(default_factory=list)
    """Generated tokens only."""
    cum_logprob: float = 0.0
    logprobs: list[dict[int, float]] = field(default_factory=list)


class BeamSearch:
    """The search state of one prompt."""

    def __init__(self, prompt_token_ids: list[int], params: BeamSearchParams, eos_token_id: int | None) -> None:
        self.prompt = list(prompt_token_ids)
        self.params = params
        self.eos = None if params.ignore_eos else eos_token_id
        self.running: list[_Beam] = [_Beam()]
        self.finished: list[tuple[float, _Beam, str]] = []
        """(score, beam, finish reason), best first, at most beam_width."""
        self._improvable = True

    @property
    def done(self) -> bool:
        return not self.running or not self._improvable

    def requests(self) -> list[list[int]]:
        """Token ids of each live beam (prompt included): one engine request each."""
        return [self.prompt + b.tokens for b in self.running]

    def advance(self, top: list[dict[int, float]]) -> None:
        """``top[i]``: live beam i's next-token logprobs (at least its best ``2W``)."""
        width, k = self.params.beam_width, 2 * self.params.beam_width
        scored = (
            (beam.cum_logprob + lp, i, token, lp) for i, beam in enumerate(self.running) for token, lp in top[i].items()
        )
        candidates = sorted(scored, key=lambda c: -c[0])[:k]
        gen_len = len(self.running[0].tokens) + 1
        running, new_finished = [], []
        for rank, (total, i, token, _lp) in enumerate(candidates):
            parent = self.running[i]
            beam = _Beam(parent.tokens + [token], total, parent.logprobs + [top[i]])
            if token == self.eos or gen_len >= self.params.max_tokens:
                if rank < width:
                    new_finished.append((total / gen_len**self.params.length_penalty, beam, _reason(token, self.eos)))
            elif len(running) < width:
                running.append(beam)
        if self._improvable:
            self.finished = sorted(self.finished + new_finished, key=lambda f: -f[0])[:width]
        self.running = running
        self._update_improvable(gen_len)

    def _update_improvable(self, gen_len: int) -> None:
        """transformers' early-stop heuristic (early_stopping=False): the best live beam, scored at its
        current length, must beat the worst finished beam once all slots are full."""
        if not self.running or len(self.finished) < self.params.beam_width:
            return
        best_live = self.running[0].cum_logprob / gen_len**self.params.length_penalty
        self._improvable = best_live > self.finished[-1][0]

    def output(self) -> list[BeamSearchSequence]:
        return [
            BeamSearchSequence(
                tokens=self.prompt + beam.tokens,
                logprobs=beam.logprobs,
                cum_logprob=beam.cum_logprob,
                score=score,
                finish_reason=reason,
            )
            for score, beam, reason in self.finished
        ]


def _reason(token: int, eos: int | None) -> str:
    return "stop" if token == eos else "length"


def run_beam_search(
    engine: OfflineEngine, prompts: Any, params: BeamSearchParams, use_tqdm: bool
) -> list[BeamSearchOutput]:
    """Drive one ``BeamSearch`` per prompt; each round is one batch of one-token requests, one per
    live beam of every prompt."""
    width = 2 * params.beam_width
    cap = engine.cfg.model.max_logprobs
    if cap != -1 and width > cap:
        raise ValueError(f"beam_width={params.beam_width}: needs 2 * beam_width <= model.max_logprobs={cap}")
    searches = [_start(engine, p, params) for p in _prompt_list(prompts)]
    step = SamplingParams(max_tokens=1, temperature=0.0, logprobs=width, ignore_eos=True, detokenize=False)
    step.output_kind = RequestOutputKind.FINAL_ONLY
    for _ in tqdm(range(params.max_tokens), desc="Beam search", disable=not use_tqdm or None):
        live = [s for s in searches if not s.done]
        if not live:
            break
        batches = [s.requests() for s in live]
        outs = iter(_run_round(engine, [r for b in batches for r in b], step))
        for search, batch in zip(live, batches):
            search.advance([next(outs).outputs[0].logprobs[0] for _ in batch])
    results = []
    for search in searches:
        sequences = search.output()
        for seq in sequences:
            seq.text = engine.tokenizer.decode(seq.tokens, skip_special_tokens=True)
        results.append(BeamSearchOutput(sequences))
    return results


def _run_round(engine: OfflineEngine, beams: list[list[int]], step: SamplingParams) -> list[Any]:
    """One request per beam (its token ids), run to the end; outputs in beam order. An error
    aborts the requests already queued."""
    requests = [engine.processor.process(None, {"prompt_token_ids": ids}, step) for ids in beams]
    req_ids: list[str] = []
    finished: dict[str, Any] = {}
    try:
        for request in requests:
            req_ids.append(engine.add_processed(request))
        while engine.has_unfinished_requests():
            finished.update((out.request_id, out) for out in engine.step() if out.finished)
    except BaseException:
        engine.abort_request(req_ids)
        raise
    return [finished[r] for r in req_ids]


def _prompt_list(prompts: Any) -> list[Any]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts: is empty; give at least one prompt")
    return prompts


def _start(engine: OfflineEngine, prompt: Any, params: BeamSearchParams) -> BeamSearch:
    """A search for one prompt, after the checks that need the model (``Processor.process``, which
    queues nothing, and one of beam search's own: prompt + max_tokens must fit, not be capped)."""
    request = engine.processor.process(None, prompt, SamplingParams(max_tokens=params.max_tokens))
    check_request_fits(len(request.prompt_token_ids), params.max_tokens, engine.cfg.max_model_len)
    return BeamSearch(request.prompt_token_ids, params, engine.eos_token_id)

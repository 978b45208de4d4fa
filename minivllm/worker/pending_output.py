"""A step's output on its way from the device to the host.

``result()`` is the step's one synchronization: it reads the sampled ids (the
batch's ``SampledTokens``, whose copy started when the step sampled) and the
logprobs when asked, and turns them into a ``ModelRunnerOutput``. The batch
stores the ids in its rows itself once they are read, so the runner knows every
token it sampled without the scheduler sending them back. With async
scheduling the engine calls it only after launching the next step; a
synchronous step calls it at once. It is idempotent.
"""

from __future__ import annotations

from minivllm.outputs import ModelRunnerOutput, PositionLogprobs
from minivllm.request import RequestId
from minivllm.sample.sampler import SamplerOutput
from minivllm.worker.input_batch import SampledTokens, record_event, to_host


class PendingOutput:
    def __init__(
        self,
        tokens: SampledTokens,
        sampled: SamplerOutput,
        num_logprobs: list[int | None],
        prompt_logprobs: dict[RequestId, list[PositionLogprobs | None]],
    ) -> None:
        """``tokens``: the step's sampled ids as the batch holds them (``InputBatch.hold_sampled``);
        ``sampled``: the sampler's output they came from, row by row of ``tokens.req_ids``;
        ``num_logprobs``: each request's ``logprobs``."""
        self.tokens = tokens
        self.req_ids = tokens.req_ids
        self._num_logprobs = num_logprobs
        self._prompt_logprobs = prompt_logprobs
        self._logprobs_host = None
        self._logprobs_copied = None
        if sampled.logprobs is not None:
            logprobs = (sampled.logprobs, sampled.logprob_token_ids, sampled.logprob_ranks)
            self._logprobs_host = [to_host(t) for t in logprobs]
            self._logprobs_copied = record_event(sampled.logprobs.device)
        self._output: ModelRunnerOutput | None = None

    @property
    def resolved(self) -> bool:
        return self._output is not None

    def result(self) -> ModelRunnerOutput:
        if self._output is not None:
            return self._output
        tokens = self.tokens.read()
        out = ModelRunnerOutput(
            sampled_token_ids={r: [t] for r, t in zip(self.req_ids, tokens.tolist())},
            prompt_logprobs=self._prompt_logprobs,
        )
        if self._logprobs_host is not None:
            if self._logprobs_copied is not None:
                self._logprobs_copied.synchronize()
            values, ids, ranks = (t.tolist() for t in self._logprobs_host)
            for row, (req_id, asked) in enumerate(zip(self.req_ids, self._num_logprobs)):
                if asked is not None:
                    pairs = dict(zip(ids[row][: 1 + asked], values[row][: 1 + asked]))
                    out.logprobs[req_id] = [PositionLogprobs(pairs, ranks[row])]
        self._output = out
        return out

"""Speculative decoding, the worker's half: drafts into the batch, verification, draft models and EAGLE heads.
The scheduler's half (proposals, lookahead slots, rollback) is ``minivllm/core/spec_decode.py``; the
accept / resample rule is the sampler's (``minivllm/sample/rejection_sampler.py``)."""

"""An engine that is dropped is freed: its model and KV cache do not outlive it.

The engine freezes the collector's view of long-lived objects (``gc.freeze``) to
keep per-step collections short; a dropped engine held in a reference cycle would
stay frozen forever unless the next engine unfreezes first.
"""

from __future__ import annotations

import gc
import weakref

from minivllm import LLM, SamplingParams


def test_a_dropped_engine_is_freed_when_the_next_one_starts(llama_dir):
    kwargs = dict(dtype="float32", num_gpu_blocks_override=16, disable_log_stats=True)
    first = LLM(str(llama_dir), **kwargs)
    first.generate("x = ", SamplingParams(max_tokens=2), use_tqdm=False)
    model = weakref.ref(first.apply_model(lambda model: model)[0])
    del first
    second = LLM(str(llama_dir), **kwargs)
    try:
        gc.collect()
        assert model() is None
    finally:
        second.shutdown()

"""One admission path: ``Processor.process`` checks and tokenizes each prompt once,
and the engine queues the processed request without doing either again."""

from __future__ import annotations

from multiprocessing import Pipe

import pytest

from minivllm import LLM, SamplingParams
from minivllm.config.llm_kwargs import config_from_kwargs
from minivllm.config.vllm_config import VllmConfig
from minivllm.engine.engine_proc import EngineLoop
from minivllm.engine.llm_engine import LLMEngine
from minivllm.engine.messages import AddRequest, EngineOutputs

KWARGS = dict(dtype="float32", block_size=8, num_gpu_blocks_override=64, max_model_len=128, disable_log_stats=True)
PROMPTS = ["def f(x):", "import os", "class Stack:"]


def _count_encodes(tokenizer, monkeypatch) -> list[str]:
    """The texts passed to ``tokenizer.encode`` or ``tokenizer(...)`` from now on."""
    texts: list[str] = []
    encode, call = tokenizer.encode, type(tokenizer).__call__

    def counted_encode(text, *args, **kwargs):
        texts.append(text)
        return encode(text, *args, **kwargs)

    def counted_call(self, text, *args, **kwargs):
        texts.append(text)
        return call(self, text, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", counted_encode)
    monkeypatch.setattr(type(tokenizer), "__call__", counted_call)
    return texts


def test_generate_tokenizes_each_string_prompt_once(llama_dir, monkeypatch):
    llm = LLM(str(llama_dir), **KWARGS)
    try:
        texts = _count_encodes(llm.get_tokenizer(), monkeypatch)
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
        assert [o.prompt for o in outs] == PROMPTS
        assert sorted(texts) == sorted(PROMPTS)  # one encode per prompt, not one to check and one to queue
    finally:
        llm.shutdown()


def test_generate_still_checks_every_prompt_before_queueing_any(llama_dir):
    llm = LLM(str(llama_dir), **KWARGS)
    try:
        with pytest.raises(ValueError, match="is longer than the maximum model length of 128"):
            llm.generate([PROMPTS[0], "x " * 200], SamplingParams(max_tokens=3), use_tqdm=False)
        assert not llm.llm_engine.has_unfinished_requests()
    finally:
        llm.shutdown()


def test_the_engine_process_queues_a_processed_request_as_it_is(llama_dir, monkeypatch):
    """What ``AsyncLLM`` and the data-parallel engine send: the engine process adds it with no
    tokenizer call and no second pass through the processor."""
    engine = LLMEngine(VllmConfig.from_dictconfig(config_from_kwargs(str(llama_dir), **KWARGS)))
    try:
        request = engine.processor.process("r", PROMPTS[0], SamplingParams(temperature=0, max_tokens=3))
        texts = _count_encodes(engine.tokenizer, monkeypatch)
        monkeypatch.setattr(engine.processor, "process", lambda *a, **k: pytest.fail("processed again"))
        commands, send = Pipe(duplex=False)
        send.send(AddRequest(request))
        msg = EngineOutputs()
        assert EngineLoop(engine).apply([commands.recv()], msg)
        assert msg.added == ["r"] and not msg.refused and texts == []
        outs = []
        while engine.has_unfinished_requests():
            outs.extend(engine.step())
        assert outs[-1].finished and outs[-1].prompt_token_ids == request.prompt_token_ids
    finally:
        engine.shutdown()

"""AsyncLLM: streaming, output kinds, abort and bad input, against the offline LLM."""

from __future__ import annotations

import asyncio

import pytest

from minivllm import LLM, SamplingParams
from minivllm.sampling_params import RequestOutputKind
from tests.serve.harness import ENGINE_KWARGS

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def push(self, x):"]


@pytest.fixture(scope="module")
def offline(llama_dir):
    llm = LLM(str(llama_dir), **{**ENGINE_KWARGS, "num_gpu_blocks_override": 64})
    yield llm
    llm.shutdown()


def greedy(max_tokens: int, kind: RequestOutputKind = RequestOutputKind.CUMULATIVE, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, output_kind=kind, **kw)


async def collect(engine, prompt, params, request_id):
    return [out async for out in engine.generate(prompt, params, request_id)]


def test_delta_stream_matches_offline_llm(async_engine, offline):
    expected = offline.generate(PROMPTS, greedy(12, logprobs=2), use_tqdm=False)

    async def run():
        return await asyncio.gather(
            *(
                collect(async_engine.engine, p, greedy(12, RequestOutputKind.DELTA, logprobs=2), f"d{i}")
                for i, p in enumerate(PROMPTS)
            )
        )

    for want, outs in zip(expected, async_engine.run(run())):
        assert len(outs) == 12  # one token per step, each streamed as it came
        assert [o.finished for o in outs] == [False] * 11 + [True]
        assert "".join(o.outputs[0].text for o in outs) == want.outputs[0].text
        assert [t for o in outs for t in o.outputs[0].token_ids] == want.outputs[0].token_ids
        logprobs = [lp for o in outs for lp in o.outputs[0].logprobs]
        for got, ref in zip(logprobs, want.outputs[0].logprobs, strict=True):
            assert got.keys() == ref.keys()
            assert list(got.values()) == pytest.approx(list(ref.values()), abs=1e-4)
        assert outs[0].prompt == want.prompt and outs[0].prompt_token_ids == want.prompt_token_ids
        assert outs[-1].outputs[0].finish_reason == "length"


def test_cumulative_and_final_only_kinds(async_engine, offline):
    want = offline.generate(PROMPTS[0], greedy(6), use_tqdm=False)[0].outputs[0]
    engine = async_engine.engine
    cumulative = async_engine.run(collect(engine, PROMPTS[0], greedy(6), "cum"))
    final = async_engine.run(collect(engine, PROMPTS[0], greedy(6, RequestOutputKind.FINAL_ONLY), "fin"))
    assert [len(o.outputs[0].token_ids) for o in cumulative] == [1, 2, 3, 4, 5, 6]
    assert cumulative[-1].outputs[0].token_ids == want.token_ids and cumulative[-1].outputs[0].text == want.text
    assert len(final) == 1 and final[0].finished and final[0].outputs[0].token_ids == want.token_ids


def test_abort_frees_blocks_before_the_next_step(async_engine):
    engine = async_engine.engine

    async def run():
        start = await engine.scheduler_stats()
        agen = engine.generate(PROMPTS[2], greedy(200, RequestOutputKind.DELTA), "long")
        first = await agen.__anext__()
        during = await engine.scheduler_stats()
        await engine.abort("long")
        after = await engine.scheduler_stats()  # answered after the abort was applied
        await agen.aclose()
        return start, first, during, after

    start, first, during, after = async_engine.run(run())
    assert not first.finished
    assert during.num_running == 1 and during.num_free_blocks < start.num_free_blocks
    assert after.num_running == 0 and after.num_waiting == 0
    assert after.num_free_blocks == start.num_free_blocks
    assert engine.get_num_unfinished_requests() == 0


def test_abort_from_another_task_ends_the_consumer_with_abort(async_engine):
    engine = async_engine.engine

    async def run():
        seen = []

        async def consume():
            async for out in engine.generate(PROMPTS[0], greedy(200), "watched"):
                seen.append(out)

        consumer = asyncio.ensure_future(consume())
        while not seen:
            await asyncio.sleep(0.005)
        await engine.abort("watched")
        await asyncio.wait_for(consumer, timeout=10)  # ends instead of waiting forever
        return seen

    seen = async_engine.run(run())
    last = seen[-1]
    assert last.finished and last.outputs[0].finish_reason == "abort"
    assert len(last.outputs[0].token_ids) == len(seen[-2].outputs[0].token_ids) >= 1  # cumulative: kept
    assert not any(o.finished for o in seen[:-1])


def test_closing_the_generator_aborts(async_engine):
    engine = async_engine.engine

    async def run():
        start = await engine.scheduler_stats()
        agen = engine.generate(PROMPTS[1], greedy(200, RequestOutputKind.DELTA), "closed")
        await agen.__anext__()
        await agen.aclose()  # what a disconnected client's handler does
        return start, await engine.scheduler_stats()

    start, after = async_engine.run(run())
    assert after.num_running == 0 and after.num_free_blocks == start.num_free_blocks


def test_bad_requests_raise_before_queueing_and_engine_keeps_serving(async_engine, offline):
    engine = async_engine.engine

    async def add(prompt, params, request_id="bad"):
        return await engine.add_request(request_id, prompt, params)

    with pytest.raises(ValueError, match="longer than the maximum model length"):
        async_engine.run(add(list(range(5, 5 + engine.cfg.max_model_len)), greedy(4)))
    with pytest.raises(ValueError, match="prompt_token_ids"):
        async_engine.run(add([10_000], greedy(4)))
    with pytest.raises(ValueError, match="logprobs"):
        async_engine.run(add("x", greedy(4, logprobs=10_000)))

    async def duplicate():
        stream = await engine.add_request("dup", "x", greedy(50))
        try:
            await engine.add_request("dup", "y", greedy(4))
        finally:
            stream.abort()

    with pytest.raises(ValueError, match="request_id"):
        async_engine.run(duplicate())
    assert engine.get_num_unfinished_requests() == 0
    want = offline.generate(PROMPTS[0], greedy(5), use_tqdm=False)[0].outputs[0].text
    assert async_engine.run(collect(engine, PROMPTS[0], greedy(5), "after"))[-1].outputs[0].text == want


def test_multi_step_decoding_streams_several_tokens_a_delta(make_engine, llama_dir, offline):
    """``scheduler.num_scheduler_steps=4`` in the engine process: deltas carry up to 4 tokens, they add
    up to the offline engine's completions, and a stop string that ends inside a delta ends the
    completion at its token (text and tokens as with one token a step)."""
    text = offline.generate(PROMPTS[0], greedy(12), use_tqdm=False)[0].outputs[0].text
    stop = next(text[i : i + 2] for i in range(len(text) // 2, len(text)) if text[i : i + 2].isascii())
    params = [greedy(12, RequestOutputKind.DELTA, stop=[stop] if i == 0 else None) for i in range(3)]
    expected = [offline.generate(p, q, use_tqdm=False)[0].outputs[0] for p, q in zip(PROMPTS, params)]
    assert expected[0].finish_reason == "stop" and len(expected[0].token_ids) < 12
    harness = make_engine(llama_dir, **{**ENGINE_KWARGS, "num_scheduler_steps": 4})

    async def run():
        return await asyncio.gather(
            *(collect(harness.engine, p, q, f"m{i}") for i, (p, q) in enumerate(zip(PROMPTS, params)))
        )

    streams = harness.run(run())
    for want, outs in zip(expected, streams):
        assert "".join(o.outputs[0].text for o in outs) == want.text
        assert [t for o in outs for t in o.outputs[0].token_ids] == want.token_ids
        last = outs[-1].outputs[0]
        assert (last.finish_reason, last.stop_reason) == (want.finish_reason, want.stop_reason)
    assert max(len(o.outputs[0].token_ids) for outs in streams for o in outs) == 4  # four steps a batch

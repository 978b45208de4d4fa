"""POST /v1/embeddings: OpenAI's request and response shapes over ``AsyncLLM.encode``.

``input`` is a string, a list of strings, a list of token ids or a list of
those lists; each becomes one pooling request (they run concurrently). With
``encoding_format="base64"`` each embedding is its little-endian float32 bytes,
base64-encoded (what the official client asks for by default). ``dimensions``
works for Matryoshka models only. Needs a server started with model.runner=pooling.
"""

from __future__ import annotations

import asyncio
import base64
import uuid

import numpy as np
from fastapi import Request

from minivllm.engine.processor import ProcessedRequest
from minivllm.pooling.params import PoolingParams
from minivllm.serve.admission import admit, check_text_length, off_loop, prompt_texts, refuse_unknown_fields
from minivllm.serve.errors import BadRequest, bad_request
from minivllm.serve.outputs import unless_disconnected
from minivllm.serve.protocol import EmbeddingData, EmbeddingRequest, EmbeddingResponse, UsageInfo
from minivllm.serve.state import ServerState


async def create_embedding(state: ServerState, body: EmbeddingRequest, raw: Request) -> EmbeddingResponse:
    state.check_model(body.model)
    refuse_unknown_fields(body)
    if state.cfg.model.runner != "pooling":
        raise BadRequest("model", "model: this server generates; start it with model.runner=pooling for embeddings")
    raw_inputs = _input_list(body.input)
    admit(state, 1, len(raw_inputs))
    try:
        params = PoolingParams(body.dimensions, body.normalize, body.truncate_prompt_tokens)
    except ValueError as err:
        raise bad_request(err) from None
    for x in raw_inputs:
        check_text_length(state, "input", prompt_texts(x), body.truncate_prompt_tokens)
    request_id = f"embd-{uuid.uuid4().hex}"
    try:  # every input is checked (and tokenized, once, off the event loop) before any is queued
        requests = await off_loop(_process_all, state, body, raw_inputs, params, request_id)
    except ValueError as err:
        raise bad_request(err, {"prompt": "input", "prompt_token_ids": "input"}) from None
    work = asyncio.gather(*(state.engine.encode_processed(r) for r in requests))
    try:  # a client that hangs up cancels the awaits, which aborts the requests
        outs = await unless_disconnected(raw, work)
    except ValueError as err:
        raise bad_request(err, {"prompt": "input", "prompt_token_ids": "input"}) from None
    data = [EmbeddingData(index=i, embedding=_encode(o.outputs.data, body.encoding_format)) for i, o in enumerate(outs)]
    num_prompt = sum(len(o.prompt_token_ids) for o in outs)
    usage = UsageInfo(prompt_tokens=num_prompt, total_tokens=num_prompt)
    return EmbeddingResponse(id=request_id, model=state.model_name, data=data, usage=usage)


def _process_all(
    state: ServerState, body: EmbeddingRequest, raw_inputs: list[object], params: PoolingParams, request_id: str
) -> list[ProcessedRequest]:
    inputs = [_prompt(state, x, body.add_special_tokens) for x in raw_inputs]
    return [
        state.engine.process(f"{request_id}-{i}", p, params, body.priority, group_id=request_id)
        for i, p in enumerate(inputs)
    ]


def _input_list(value: object) -> list[object]:
    if isinstance(value, str) or (isinstance(value, list) and value and isinstance(value[0], int)):
        return [value]
    if not value:
        raise BadRequest("input", "input: is empty; give a string, a list of strings or token ids")
    return list(value)


def _prompt(state: ServerState, value: object, add_special_tokens: bool) -> object:
    if isinstance(value, str):
        if not value:
            raise BadRequest("input", "input: an empty string cannot be embedded")
        ids = state.engine.tokenizer.encode(value, add_special_tokens=add_special_tokens, verbose=False)
        return {"prompt": value, "prompt_token_ids": ids}
    return {"prompt_token_ids": value}


def _encode(vector, encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector.tolist()
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")

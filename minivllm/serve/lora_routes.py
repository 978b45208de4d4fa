"""``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (with serve.enable_lora_runtime_updates).

A loaded adapter is checked (files, rank, target modules, shapes) before it is
served: a bad one is a 400 and nothing changes. Unloading an unknown name is a 404.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict

from minivllm.serve.errors import ModelNotFound
from minivllm.serve.params import BadRequest
from minivllm.serve.state import ServerState


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str


def add_lora_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/load_lora_adapter")
    async def load(body: LoadLoRAAdapterRequest) -> PlainTextResponse:
        try:
            state.adapters.load(body.lora_name, body.lora_path)
        except ValueError as err:
            raise BadRequest("lora_path", str(err)) from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload(body: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        try:
            state.adapters.unload(body.lora_name)
        except KeyError:
            raise ModelNotFound(body.lora_name, ", ".join(state.adapters.by_name) or "no adapters") from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

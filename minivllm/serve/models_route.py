"""GET /v1/models and GET /v1/models/{id} (the openai client's ``models.list`` and
``models.retrieve``): every served name of the base model, then each LoRA adapter.
An id that is not served is a 404 with an OpenAI error body."""

from __future__ import annotations

from fastapi import FastAPI

from minivllm.serve.errors import ModelNotFound
from minivllm.serve.protocol import ModelCard, ModelList
from minivllm.serve.state import ServerState


def model_cards(state: ServerState) -> list[ModelCard]:
    root, max_len = state.cfg.model.path, state.cfg.max_model_len
    cards = [ModelCard(id=name, root=root, max_model_len=max_len) for name in state.model_names]
    adapters = [
        ModelCard(id=name, root=lora.lora_path, parent=state.model_name, max_model_len=max_len)
        for name, lora in state.adapters.by_name.items()
    ]
    return [*cards, *adapters]


def add_model_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=model_cards(state))

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> ModelCard:
        cards = model_cards(state)
        card = next((c for c in cards if c.id == model_id), None)
        if card is None:
            raise ModelNotFound(model_id, ", ".join(c.id for c in cards))
        return card

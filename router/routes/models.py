"""OpenAI's models API: the base model and every live adapter, as model cards."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from tracefix.router.routes.dependencies import Config, CurrentBackend, Started, Table
from tracefix.router.routes.errors import model_not_found

router = APIRouter()


def model_card(name: str, created: int, root: str, parent: str | None) -> dict[str, Any]:
    return {
        "id": name, "object": "model", "created": created, "owned_by": "tracefix", "root": root, "parent": parent,
    }  # fmt: skip


def model_cards(backend: CurrentBackend, table: Table, settings: Config, started: Started) -> list[dict[str, Any]]:
    """The base model (created when the router started), then each live adapter (when it was loaded)."""
    base_name = settings.model_name
    cards = [model_card(base_name, started, str(backend.model_dir), None)]
    cards += [model_card(a.name, int(a.loaded_at), a.path, base_name) for a in table.live()]
    return cards


Cards = Annotated[list[dict[str, Any]], Depends(model_cards)]


@router.get("/v1/models")
def list_models(cards: Cards) -> dict[str, Any]:
    return {"object": "list", "data": cards}


@router.get("/v1/models/{name}")
def get_model(name: str, cards: Cards) -> dict[str, Any]:
    card = next((card for card in cards if card["id"] == name), None)
    if card is None:
        raise model_not_found(name)
    return card

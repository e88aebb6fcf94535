"""tests/apps/conformance.py's routes in Django with Channels: Django's ASGI handler for HTTP
(tests/apps/conformance_django.py's views), a Channels consumer for the WebSocket. Channels'
router has no lifespan either: `/lifespan` answers "no lifespan"."""

from __future__ import annotations

import conformance_django
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.routing import ProtocolTypeRouter, URLRouter
from conformance import CLOSE_CODE, CLOSE_REASON, SUBPROTOCOL
from django.urls import path


class Echo(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        offered = self.scope["subprotocols"]
        await self.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if text_data == "close":
            await self.close(code=CLOSE_CODE, reason=CLOSE_REASON)
        elif text_data is not None:
            await self.send(text_data=text_data)
        else:
            await self.send(bytes_data=bytes_data)


application = ProtocolTypeRouter(
    {
        "http": conformance_django.application,
        "websocket": URLRouter([path("ws", Echo.as_asgi())]),
    }
)

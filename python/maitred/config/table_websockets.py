"""The settings table's WebSocket rows (docs/PROTOCOL.md, section 5; docs/LIMITS.md,
"WebSockets are bounded both ways"), with uvicorn's names where uvicorn has the setting; the lobby
receives them. table.py puts them after the lobby's other rows. ASGI workers only.

May import: setting.py and values.py.
"""

from __future__ import annotations

from maitred.config.setting import Setting
from maitred.config.values import _boolean, _boolean_value, _whole_number, seconds

ROWS: tuple[Setting, ...] = (
    Setting(
        "websockets",
        "ws_max_size",
        ("--ws-max-size",),
        "BYTES",
        # WS_MESSAGE and WS_SEND carry a whole message, up to 64 MiB (docs/PROTOCOL.md, section 5).
        _whole_number(1, 64 << 20),
        16 << 20,
        "Largest WebSocket message, either way (uvicorn's name and default); a larger one from the client "
        "closes its WebSocket with 1009. ASGI workers only (docs/PROTOCOL.md, WebSockets).",
    ),
    Setting(
        "websockets",
        "ws_ping_interval",
        ("--ws-ping-interval",),
        "SECONDS",
        seconds(allow_zero=False),
        20.0,
        "A WebSocket whose client has sent nothing for this long is pinged (uvicorn's name and default).",
    ),
    Setting(
        "websockets",
        "ws_ping_timeout",
        ("--ws-ping-timeout",),
        "SECONDS",
        seconds(allow_zero=False),
        20.0,
        "A WebSocket whose client has not answered a ping within this is closed with 1011 (uvicorn's name and "
        "default).",
    ),
    Setting(
        "websockets",
        "ws_per_message_deflate",
        ("--ws-per-message-deflate",),
        "BOOL",
        _boolean,
        True,
        "Take a client's permessage-deflate offer (RFC 7692), compressing messages both ways (uvicorn's name "
        "and default); each message on its own, so that no compression state stays with a connection "
        "(docs/LIMITS.md, WebSockets). false: never compress.",
        default_text="true",
        from_python=_boolean_value,
    ),
    Setting(
        "websockets",
        "websocket_seats",
        ("--websocket-seats",),
        "INT",
        _whole_number(1, 64),
        None,
        "Deprecated, and does nothing: an ASGI worker's open WebSockets hold no seat, and a handshake waits in "
        "the one queue as any request does. Still accepted, with one warning line at start, so that an old "
        "config file starts (docs/TUNING.md, WebSockets).",
        default_text="none",
        for_lobby=False,
    ),
)

"""Test doubles of services for ``tectofs.wire.server.RpcServer``."""

from __future__ import annotations

from typing import Any

from tectofs.wire import messages
from tectofs.wire.server import Handler, Handlers


def answering(answer: Handler[Any, Any], operations: dict[str, messages.AnyOperation]) -> Handlers:
    """Handlers that serve every operation of ``operations`` (but the hello) with ``answer``."""
    handlers = Handlers()
    for operation in operations.values():
        if operation is not messages.HELLO:
            handlers.add(operation, answer)
    return handlers

"""Telling a service manager how the process is doing (systemd's ``Type=notify`` protocol).

When the process runs under a manager that set ``NOTIFY_SOCKET`` (a path, or ``@name`` for
an abstract socket), :func:`notify` sends it one datagram of ``KEY=value`` lines:
``READY=1`` once the process serves, ``STOPPING=1`` when it begins to shut down, ``STATUS=...``
for a line ``systemctl status`` shows. Without ``NOTIFY_SOCKET`` it does nothing, so the
commands call it unconditionally. A manager that does not read its socket never blocks the
process: the datagram is sent without waiting and dropped if the socket is full.
"""

from __future__ import annotations

import os
import socket

from watchkeeper.store.protocols import get_logger

__all__ = ["notify"]

log = get_logger(__name__)


def notify(**fields: str | int) -> bool:
    """Send ``fields`` (``notify(READY=1, STATUS="serving")``) to the service manager.

    Returns whether a datagram was sent: False when no manager asked for one, or when the
    socket could not take it (logged once as ``service_notify_failed``, never raised).
    """
    address = os.environ.get("NOTIFY_SOCKET")
    if not address or not fields:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # an abstract socket
    message = "\n".join(f"{key}={_one_line(value)}" for key, value in fields.items())
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            sock.sendto(message.encode(), address)
    except OSError as exc:
        log.warning("service_notify_failed", error=f"{type(exc).__name__}: {exc}")
        return False
    return True


def _one_line(value: str | int) -> str:
    return " ".join(str(value).split())

"""Listening sockets for the daemon and the router, bound before serving so a taken port is a clear
error instead of a traceback from deep inside the server."""

from __future__ import annotations

import socket


def bind(host: str, port: int, process: str = "tracefix") -> socket.socket:
    """A listening, inheritable socket on ``host:port`` (IPv6 when the host has a colon)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise OSError(f"cannot bind {host}:{port} ({error.strerror}); is another {process} running?") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock

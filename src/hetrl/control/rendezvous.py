"""Rendezvous for torch.distributed groups: the rank hosting the TCP store picks a free port on
its host and broadcasts ``(host, port)`` to the others over the MPI control plane."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on this host now (the OS picks it; another process may take it before use)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]

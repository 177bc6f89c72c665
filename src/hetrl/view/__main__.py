"""``python -m hetrl.view RUN [--port N] [--host ADDR]``: serve a run directory to a local browser.

Binds 127.0.0.1 by default: the pages show prompts, completions and the resolved recipe, which
should not reach the network unless asked for (``--host``, with a warning). From a login node of
a cluster: ``ssh -L 8765:127.0.0.1:8765 login`` and open the printed URL on the laptop.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import uvicorn

from hetrl.view import run_data
from hetrl.view.app import build_app

DEFAULT_PORT = 8765
LOCAL_HOST = "127.0.0.1"


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hetrl.view", description="Serve a run's overview, metrics, rollouts and timeline to a browser."
    )
    parser.add_argument("run", type=Path, help="run directory (finished or in progress)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free)")
    parser.add_argument("--host", default=LOCAL_HOST, help=f"address to bind (default {LOCAL_HOST}: this machine only)")
    args = parser.parse_args(list(argv))
    if not args.run.is_dir():
        print(f"error: no run directory at {args.run}", file=sys.stderr)
        return 2
    if args.host != LOCAL_HOST:
        print(
            f"warning: binding {args.host}: anyone who can reach this machine can read the run's prompts, "
            "completions and recipe; there is no login",
            file=sys.stderr,
        )
    # Bound and listening here, before the server starts: the printed URL carries the port --port 0
    # got, and a browser that connects at once waits in the backlog instead of being refused.
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
        sock.listen(128)
    except OSError as err:
        print(f"error: cannot listen on {args.host}:{args.port}: {err} (another --port?)", file=sys.stderr)
        return 2
    port = sock.getsockname()[1]
    print(f"[hetrl] viewing {args.run} at http://{args.host}:{port}/ (Ctrl-C stops)", flush=True)
    threading.Thread(target=run_data.import_advantages, name="hetrl-view-import", daemon=True).start()
    uvicorn.Server(uvicorn.Config(build_app(args.run), log_level="warning")).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

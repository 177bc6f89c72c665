"""The run viewer's web app: four pages over one run directory and the JSON they draw from.

Starlette (an ASGI toolkit: routing, static files, JSON responses; vLLM already pulls it in) serves
``/`` (Overview), ``/metrics``, ``/rollouts`` and ``/timeline``, each the same HTML shell whose
script (``static/viewer.js``) fetches ``/api/...`` and draws; charts are uPlot, served from
``static/`` like everything else, so no page loads anything from the internet. The app only reads
the run directory (:mod:`hetrl.view.run_data`); an error becomes a message on the page.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from hetrl.control import rundir
from hetrl.view import run_data

STATIC = Path(__file__).parent / "static"
PAGES = {"/": "overview", "/metrics": "metrics", "/rollouts": "rollouts", "/timeline": "timeline"}
_TOKENIZER_FILE = "tokenizer.json"
# Query keys of the Rollouts page's filters -> (select_rows keyword, type).
_FILTERS: dict[str, tuple[str, type]] = {
    "task": ("task", str),
    "flag": ("flag", str),
    "finish": ("finish", str),
    "min_len": ("min_len", int),
    "max_len": ("max_len", int),
    "min_reward": ("min_reward", float),
    "max_reward": ("max_reward", float),
    "worst": ("worst", int),
    "best": ("best", int),
}


def _tokenizer_dir(run: Path) -> Path | None:
    """Where the run's tokenizer lives: the random-init model's (RUN/initial_model), else the recipe's."""
    model = run_data.run_config(run).get("model")
    model = model if isinstance(model, dict) else {}
    candidates: list[Any] = [run / rundir.INITIAL_MODEL, model.get("tokenizer"), model.get("hf_checkpoint")]
    return next((Path(c) for c in candidates if c and (Path(c) / _TOKENIZER_FILE).is_file()), None)


def token_pieces(run: Path) -> Callable[[list[int]], list[str] | None]:
    """Token ids -> each token's text, with the run's tokenizer (loaded once, on first use); None without one."""
    loaded: list[Any] = []

    def pieces(ids: list[int]) -> list[str] | None:
        if not loaded:
            where = _tokenizer_dir(run)
            # tokenizers (the Rust library under transformers) reads tokenizer.json without transformers' import cost
            from tokenizers import Tokenizer

            loaded.append(Tokenizer.from_file(str(where / _TOKENIZER_FILE)) if where else None)
        tok = loaded[0]
        return None if tok is None else [tok.decode([i], skip_special_tokens=False) for i in ids]

    return pieces


def _page(name: str, run: Path) -> HTMLResponse:
    shell = (STATIC / "page.html").read_text()
    return HTMLResponse(shell.replace("{{page}}", name).replace("{{run}}", html.escape(run.name)))


def _filters(request: Request) -> dict[str, Any]:
    out = {}
    for key, (keyword, kind) in _FILTERS.items():
        value = request.query_params.get(key, "")
        if value != "":
            try:
                out[keyword] = kind(value)
            except ValueError as err:
                raise HTTPException(400, f"filter {key}={value!r} is not a {kind.__name__}") from err
    if "worst" in out and "best" in out:
        raise HTTPException(400, "worst and best are exclusive")
    return out


def _int(request: Request, key: str, default: int | None = None) -> int:
    value = request.path_params.get(key, request.query_params.get(key, default))
    try:
        return int(value)
    except (TypeError, ValueError) as err:
        raise HTTPException(400, f"{key} must be an integer, got {value!r}") from err


def build_app(run: Path) -> Starlette:
    """The viewer over run directory ``run`` (it need not exist yet: the pages say what is missing)."""
    run = Path(run)
    pieces = token_pieces(run)

    def page(name: str) -> Callable[[Request], Response]:
        return lambda request: _page(name, run)

    async def api_overview(request: Request) -> Response:
        return JSONResponse(run_data.overview(run))

    async def api_metrics(request: Request) -> Response:
        return JSONResponse(run_data.metrics_since(run, _int(request, "offset", 0)))

    async def api_steps(request: Request) -> Response:
        return JSONResponse(run_data.rollout_steps(run))

    async def api_step(request: Request) -> Response:
        groups = max(1, _int(request, "groups", 20))
        return JSONResponse(run_data.step_groups(run, _int(request, "step"), _filters(request), groups))

    async def api_sample(request: Request) -> Response:
        detail = run_data.sample_detail(run, _int(request, "step"), request.path_params["sample_id"], pieces)
        return JSONResponse(json.loads(json.dumps(detail, default=repr)))  # env info may hold any object

    async def api_image(request: Request) -> Response:
        png = run_data.sample_image(run, _int(request, "step"), request.path_params["sample_id"], _int(request, "k"))
        if png is None:
            raise HTTPException(404, "no such image")
        return Response(png, media_type="image/png")

    async def api_timeline(request: Request) -> Response:
        return JSONResponse(run_data.timeline_view(run, max(1, _int(request, "steps", 3))))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return JSONResponse({"missing": [exc.detail]}, status_code=exc.status_code)

    async def server_error(request: Request, exc: Exception) -> Response:
        # The page shows the message in its banner; the traceback stays in the server's log.
        return JSONResponse({"missing": [f"the viewer failed: {type(exc).__name__}: {exc}"]}, status_code=500)

    routes = [Route(path, page(name)) for path, name in PAGES.items()]
    routes += [
        Route("/api/overview", api_overview),
        Route("/api/metrics", api_metrics),
        Route("/api/steps", api_steps),
        Route("/api/step/{step}", api_step),
        Route("/api/sample/{step}/{sample_id:path}", api_sample),
        Route("/api/image/{step}/{k}/{sample_id:path}", api_image),
        Route("/api/timeline", api_timeline),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})

"""The viewer's HTTP app: one page and the JSON routes it polls while a run goes on.

What it is: ``build_app(runs)`` — a FastAPI app over one or more ``RunData`` (the first is
the run looked at; the others are compared with it on the curves):

    GET /                                  the page (styles and script inline, no other asset)
    GET /api/runs                          [info of each run: name, config, summary, steps, has_eval]
    GET /api/runs/{r}/metrics?since=N      metrics rows from the N-th on (polled: only new rows travel)
    GET /api/runs/{r}/steps/{step}         that step's sampled trajectories (each with its episode's record)
    GET /api/runs/{r}/record/{step}        every trajectory of that step, whole, with the episodes' records
    GET /api/runs/{r}/eval                 the per-problem results of ``agentrl eval``

Trust boundary. Covered: the routes read only the files of the run directories given on
the command line (run and step are integers, never paths); the page inserts every token and
every string of a run as text, never as HTML; the server binds 127.0.0.1 unless told
otherwise and loads nothing from elsewhere. Not covered: there is no authentication — anyone
who can reach the port reads the runs (bind another host only on a network you trust).

What it is not: the reader of the files (``agentrl.view.rundata``) or the page itself
(``agentrl/view/static/``). Main hook: ``build_app([RunData(path), ...])``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse

from agentrl.view.page import render_page
from agentrl.view.rundata import RunData


def build_app(runs: Sequence[RunData]) -> FastAPI:
    if not runs:
        raise ValueError("build_app needs at least one run")
    app = FastAPI(title="agentrl view", docs_url=None, redoc_url=None, openapi_url=None)
    page = render_page(None, title=f"agentrl view: {runs[0].name}")

    def run_at(r: int) -> RunData:
        if not 0 <= r < len(runs):
            raise HTTPException(404, f"no run {r}: this viewer shows runs 0..{len(runs) - 1}")
        return runs[r]

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page

    @app.get("/api/runs")
    def run_list() -> list[dict[str, Any]]:
        return [run.info() for run in runs]

    @app.get("/api/runs/{r}/metrics")
    def metrics(r: int, since: int = 0) -> dict[str, Any]:
        return run_at(r).metrics(since)

    @app.get("/api/runs/{r}/steps/{step}")
    def trajectories(r: int, step: int) -> list[dict[str, Any]]:
        return run_at(r).trajectories(step)

    @app.get("/api/runs/{r}/record/{step}")
    def record(r: int, step: int) -> list[dict[str, Any]]:
        return run_at(r).record(step)

    @app.get("/api/runs/{r}/eval")
    def evaluation(r: int) -> list[dict[str, Any]]:
        return run_at(r).evaluation()

    return app

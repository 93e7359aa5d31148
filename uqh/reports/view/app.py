"""The `uqh view` web application (aiohttp): three pages rendered from Jinja2 templates and the JSON they poll.

Pages (``assets/view_*.html.j2``) are shells; ``view.js`` fills them from the JSON routes and polls them, so a
page shows a run as it grows without reloading what did not change:

- ``/``                          the run list           <- ``/api/runs`` (manifests and line-index counts only);
- ``/run/{key}``                 one run's trajectories <- ``/api/run/{key}/trajectories?since=N`` (the summaries
  from position N on: the page asks only for what it has not got);
- ``/run/{key}/trajectory?id=E`` one trajectory         <- ``/api/run/{key}/trajectory?id=E`` (one episode and its
  sidecar rows, read through the line index).

Reading happens in a worker thread, one at a time per run (:class:`uqh.reports.view.runs.ViewedRun` holds the
lock), so the event loop keeps answering. Nothing is ever written into a run directory.
"""
from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any, Callable

from aiohttp import web

from uqh.reports.report.html import ASSETS as REPORT_ASSETS
from uqh.reports.view.run_discovery import check_given, find_directories
from uqh.reports.view.runs import ViewedRun, attach_judgments, attach_probes, attach_qz
from uqh.rundir.errors import UserError

ASSETS = Path(__file__).resolve().parent / "assets"
#: Files served under /static/: the report's shared chart code and stylesheet, and the viewer's own.
STATIC = {
    "trace_chart.js": (REPORT_ASSETS / "trace_chart.js", "application/javascript"),
    "report.css": (REPORT_ASSETS / "report.css", "text/css"),
    "view.js": (ASSETS / "view.js", "application/javascript"),
    "view.css": (ASSETS / "view.css", "text/css"),
}
#: How often the pages poll, in milliseconds (the issue asks for updates within a few seconds).
POLL_MS = 2000


class Viewer:
    """The runs being viewed, by URL key, and the notes about directories that could not be read.

    :meth:`update` brings the runs in line with what is on disk (called at start-up and by
    :mod:`uqh.reports.view.follow` whenever the folders change): a new run gets the next key (keys are never reused,
    so an open page never shows another run), a deleted one leaves. ``runs`` is replaced, never changed in place,
    so a request that iterates it while an update runs in another thread sees one state or the other."""

    def __init__(self, paths: list[Path]):
        self.paths = [Path(p) for p in paths]
        check_given(self.paths)  # UserError for a path that is not there, before anything starts
        self.runs: dict[str, ViewedRun] = {}
        self.notes: list[str] = []
        self.judges: list[Path] = []
        self.probes: list[Path] = []
        self.next_key = 0
        #: How new and deleted runs are being found ("watch" or "poll"; None until the server follows the folders).
        self.follow_method: str | None = None
        self.update()

    def update(self) -> bool:
        """Scan the paths again and apply what changed; returns whether anything did."""
        found = find_directories(self.paths)
        # a directory deleted and made again at the same path (a run started afresh) is another run
        known = {r.path: r for r in self.runs.values() if r.is_same_run()}
        if (len(known) == len(self.runs) and set(known) == set(found.runs) and found.judges == self.judges
                and found.probes == self.probes):
            return False
        runs = {k: r for k, r in self.runs.items() if known.get(r.path) is r and r.path in set(found.runs)}
        for path in found.runs:
            if path not in known:
                runs[str(self.next_key)] = ViewedRun.open(str(self.next_key), path)
                self.next_key += 1
        attach_qz(list(runs.values()))
        notes = attach_judgments(list(runs.values()), found.judges)
        notes += attach_probes(list(runs.values()), found.probes)
        self.runs, self.notes, self.judges, self.probes = runs, notes, found.judges, found.probes
        return True

    def run(self, key: str) -> ViewedRun:
        run = self.runs.get(key)
        if run is None:
            raise web.HTTPNotFound(text=f"no run {key!r} here (its directory may have been deleted)")
        return run


async def in_thread(run: ViewedRun, fn: Callable[[], Any], lock=None) -> Any:
    """``fn`` in a worker thread with ``lock`` (the run's lock by default) held; a UserError (a bad line met) is a
    422 with its text."""
    def locked():
        with lock or run.lock:
            return fn()
    try:
        return await asyncio.to_thread(locked)
    except UserError as exc:
        raise web.HTTPUnprocessableEntity(text=str(exc)) from None
    except OSError as exc:
        raise web.HTTPUnprocessableEntity(text=f"cannot read {exc.filename or run.path}: {exc.strerror or exc}") from None


_platt_tasks: dict[int, asyncio.Task] = {}  # by id() of the ViewedRun: keys repeat between viewers


def start_platt(run: ViewedRun) -> None:
    """Summarise every finished episode and fit the Platt map, in the background, a chunk at a time (the run's
    lock is released between chunks, so its pages keep answering); one such task per run at a time."""
    task = _platt_tasks.get(id(run))
    if run.reader is None or (task is not None and not task.done()):
        return

    async def work() -> None:
        try:
            while True:
                out = await in_thread(run, functools.partial(run.trajectories, len(run.summaries)))
                if out["read"] >= out["done"]:
                    break
            await in_thread(run, run.fit_platt)
        except web.HTTPException:  # the run became unreadable (deleted): its page says so when asked
            pass

    _platt_tasks[id(run)] = asyncio.get_running_loop().create_task(work())


@functools.lru_cache(maxsize=1)
def _environment():
    from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

    return Environment(loader=FileSystemLoader(str(ASSETS)), autoescape=select_autoescape(["j2", "html"]),
                       undefined=StrictUndefined)


def page(template: str, **context: Any) -> web.Response:
    env = _environment()
    text = env.get_template(template).render(poll_ms=POLL_MS, **context)
    return web.Response(text=text, content_type="text/html")


def make_app(viewer: Viewer) -> web.Application:
    app = web.Application()
    routes = web.RouteTableDef()

    @routes.get("/")
    async def run_list(request: web.Request) -> web.Response:
        return page("view_runs.html.j2", title="uqh view")

    @routes.get("/run/{key}")
    async def run_page(request: web.Request) -> web.Response:
        run = viewer.run(request.match_info["key"])
        return page("view_run.html.j2", title=f"uqh view · {run.path.name}", key=run.key, path=str(run.path))

    @routes.get("/run/{key}/trajectory")
    async def trajectory_page(request: web.Request) -> web.Response:
        run = viewer.run(request.match_info["key"])
        eid = request.query.get("id", "")
        return page("view_trajectory.html.j2", title=f"uqh view · {eid}", key=run.key, path=str(run.path),
                    episode_id=eid)

    @routes.get("/api/runs")
    async def api_runs(request: web.Request) -> web.Response:
        rows = [await in_thread(r, r.overview, r.list_lock) for r in list(viewer.runs.values())]
        return web.json_response({"runs": rows, "notes": viewer.notes})

    @routes.get("/api/run/{key}/trajectories")
    async def api_trajectories(request: web.Request) -> web.Response:
        run = viewer.run(request.match_info["key"])
        try:
            since = max(0, int(request.query.get("since", "0")))
        except ValueError:
            raise web.HTTPBadRequest(text="since must be a whole number") from None
        out = await in_thread(run, functools.partial(run.trajectories, since))
        if out["read"] == out["done"]:
            start_platt(run)
        return web.json_response(out)

    @routes.get("/api/run/{key}/trajectory")
    async def api_trajectory(request: web.Request) -> web.Response:
        run = viewer.run(request.match_info["key"])
        eid = request.query.get("id", "")
        out = await in_thread(run, functools.partial(run.trajectory, eid), run.page_lock)
        if out is not None and out["platt_pending"]:
            start_platt(run)
        if out is None:
            raise web.HTTPNotFound(text=f"no episode {eid!r} in {run.path} (neither finished nor in progress)")
        return web.json_response(out)

    @routes.get("/static/{name}")
    async def static(request: web.Request) -> web.Response:
        item = STATIC.get(request.match_info["name"])
        if item is None:
            raise web.HTTPNotFound()
        path, content_type = item
        return web.Response(text=path.read_text(), content_type=content_type)

    app.add_routes(routes)
    return app

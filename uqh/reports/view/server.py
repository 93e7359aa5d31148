"""Serving the viewer: bind the socket first (a port in use is a one-line UserError before anything starts), then
run the aiohttp application, and follow the folders for new and deleted runs (:mod:`uqh.reports.view.follow`),
until :meth:`ViewServer.stop` is called (from a signal handler or another thread)."""
from __future__ import annotations

import asyncio
import errno
import socket
import threading
from pathlib import Path

from aiohttp import web

from uqh.reports.view.app import Viewer, make_app
from uqh.reports.view.follow import METHODS, follow
from uqh.rundir.errors import UserError


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free one. UserError when it cannot be had."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UserError(f"--host {host}: cannot resolve it ({exc.strerror})") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UserError(f"port {port} on {host} is in use; pass another --port (or --port 0 for a free one)") from None
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


class ViewServer:
    """The viewer over ``paths`` on a bound socket; :meth:`serve` blocks until :meth:`stop`."""

    def __init__(self, paths: list[Path], host: str = "127.0.0.1", port: int = 0, follow: str = "auto"):
        if follow not in METHODS:
            raise ValueError(f"follow={follow!r} is not one of {METHODS}")
        self.viewer = Viewer(paths)  # UserError for a path that is not there, before binding
        self.sock = bind(host, port)
        self.host = host
        #: How new and deleted runs are found while serving (:func:`uqh.reports.view.follow.follow`).
        self.follow = follow
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self.ready = threading.Event()

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"

    def serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        runner = web.AppRunner(make_app(self.viewer), access_log=None)
        await runner.setup()
        following = asyncio.create_task(follow(self.viewer, self._stopping, self.follow))
        try:
            await web.SockSite(runner, self.sock).start()
            self.ready.set()
            await self._stopping.wait()
        finally:
            self._stopping.set()
            try:
                await asyncio.wait_for(following, timeout=10)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                pass
            await runner.cleanup()

    def stop(self) -> None:
        """Ask the server to stop (safe from any thread or a signal handler); :meth:`serve` then returns."""
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)

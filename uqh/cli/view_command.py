"""`uqh view [DIR...] [--port P] [--host H]`: a local web server over run directories, live while they grow."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from uqh.rundir.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="*", type=Path, default=[Path(".")], metavar="DIR",
                   help="run directories, or folders searched recursively for run, continuation, judge and probe "
                        "directories (default: the current directory)")
    p.add_argument("--port", type=int, default=7575, help="TCP port (default 7575; 0 picks a free one)")
    p.add_argument("--poll", action="store_true",
                   help="find new and deleted runs by scanning the folders every 2 s instead of watching them "
                        "(network file systems, where watching misses other hosts' writes; the default polls too "
                        "when the `view` extra's watchfiles is not installed)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; the viewer has no login)")


def run(args: argparse.Namespace) -> int:
    from uqh.harness import interrupts
    from uqh.reports.view.server import ViewServer

    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port} is not a TCP port (0..65535)")
    server = ViewServer(list(args.dirs), host=args.host, port=args.port, follow="poll" if args.poll else "auto")
    runs = len(server.viewer.runs)
    print(f"uqh view: {runs} run director{'y' if runs == 1 else 'ies'} at {server.url} (new ones are listed as "
          "they appear; Ctrl-C stops)", flush=True)
    with interrupts.on_stop(lambda signum: server.stop()):
        server.serve()
    print("uqh view: stopped", file=sys.stderr)
    return 0

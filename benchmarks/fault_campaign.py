"""The fault campaign behind the README's Reliability section: attack ``uqh`` end to end and count what held.

    .venv/bin/python benchmarks/fault_campaign.py [--quick] [--kills N] [--fault-episodes N] [--fault-rate R]
        [--load-concurrency C] [--load-episodes N] [--only kills,faults,load,breaker,secrets,inputs]
        [--out benchmarks/results/fault_campaign.md]

Every command is the real CLI (``python -m uqh.cli ...`` in a subprocess) against the fault server of
``benchmarks/fake_server_process.py`` in its own process (the scripted arithmetic agent and GPA judge of
``tests/judge_fixtures.py``, so every answer is a deterministic function of the request, and any fault of
``tests/fake_openai_server.py`` at a chosen rate). Verdicts use the project's own readers (``uqh.rundir``:
``RunDir``, ``integrity.scan_for_writer``, ``JudgeDir``) and compare every record with a fault-free reference run
of the same command, so "held" means: exactly the planned records, none twice, no torn or invalid line, the
sidecar consistent (no orphan, no missing row), and each record equal to the reference (no bad data).

- ``kills``: ``kill -9`` at a random moment (uniform over 20-95% of the mode's fault-free duration) of one of five
  modes in turn -- ``uqh run`` (one process), ``uqh run --workers 2`` (the parent killed), the whole process
  group of ``--workers 2``, ``uqh continue``, ``uqh judge`` --; then the same command again, then the checks. A
  process of the killed command (fork server, worker) still running 15 s after the kill is a failure too (it is
  then killed).
- ``faults``: one run per fault type at ``--fault-rate`` of the requests, re-run until it exits 0 (an episode
  whose call failed is an infrastructure error, not written, and re-queued by the re-run); then the checks.
- ``load``: ``--load-episodes`` arithmetic episodes at ``--concurrency`` C in one command: 0 failures, calls/s.
- ``breaker``: an endpoint that always answers 500: the batch must stop with one line, the resume hint and exit
  1; seconds and requests until it stops.
- ``secrets``: a canary key passed every way a key arrives (environment, ``.env``, an error body echoing it, with
  ``-v``; and in a URL -- userinfo, a malformed ``u:pa/ss@host``, ``;`` path parameters, query, fragment -- every
  way the CLI takes one: ``--api-base``, ``--endpoints FILE``, ``--user-api-base``, ``--es-url``, ``-D es_url=``,
  continue, judge, probe, index); every file written (run, continuation, judge and report directories, locks,
  checkpoints) and every stdout/stderr is searched for it, for ``CANARY`` and for any 8-character piece of it.
  The echoing server puts 0-300 characters before the key, so it lies inside or across a 300-character cut.
- ``inputs``: every bad input of the project's sweep (``tests/test_bad_inputs.py``'s ``CASES``) as a real CLI
  subprocess, plus what the sweep cannot do in-process (a bad or empty ``LITELLM_LOG``, ``uqh -v`` printing nothing
  of litellm on stdout, an unreachable endpoint with ``--workers 2`` several times, ``uqh`` without a command, an
  empty run under every reading command); counts the tracebacks, the wrong exit 0s and every other deviation
  from "one line on stderr naming the problem, exit 2 (1 for the endpoint), nothing on stdout, nothing written".

Writes ``--out`` (Markdown) and the same results as JSON next to it. ``--quick`` is a small version (a few
minutes; ``tests/test_fault_campaign.py`` runs a part of it). Sizes and the machine's load are recorded: results are measured, not asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "tests")]
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from fake_openai_server import FAULTS  # noqa: E402
from fake_server_process import FakeServerProcess  # noqa: E402

from uqh.rundir import integrity  # noqa: E402
from uqh.rundir.errors import UserError  # noqa: E402
from uqh.rundir.judgments import JUDGMENTS_FILE, JudgeDir  # noqa: E402
from uqh.rundir.reader import RunDir  # noqa: E402
from uqh.rundir.schema import EPISODES_FILE, SIDECAR_FILE  # noqa: E402

PY = sys.executable
KILL_MODES = ("run", "run --workers 2 (parent)", "run --workers 2 (process group)", "continue", "judge")
MAX_PASSES = 12  # re-runs of a faulted run before it counts as not finishing
MAX_PROBLEMS = 8  # problems listed per check (the count is complete)


@dataclass
class Category:
    """One line of the results table: how many attacks were tried, how many held, and what failed."""

    name: str
    command: str
    tried: int = 0
    held: int = 0
    details: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    numbers: dict = field(default_factory=dict)

    def record(self, label: str, problems: list[str]) -> None:
        self.tried += 1
        if problems:
            self.failures.append(f"{label}: " + "; ".join(problems[:MAX_PROBLEMS]))
        else:
            self.held += 1


# ----------------------------------------------------------------------------------------------- verdicts


def episode_signature(ep) -> tuple:
    """What a fault must not change about an episode: how it ended and every action taken."""
    return (ep.stop_reason.value, ep.outcome, ep.n_steps, tuple(s.action for s in ep.steps))


def expected_episodes(run_dir: Path) -> dict[str, tuple]:
    """Episode id -> signature of a (fault-free, reference) run directory."""
    return {ep.episode_id: episode_signature(ep) for ep in RunDir.open(run_dir).episodes()}


def check_run_dir(run_dir: Path, expected: dict[str, tuple | None]) -> list[str]:
    """Every way ``run_dir`` differs from a whole, clean run of exactly the ``expected`` episodes (id ->
    signature; None skips the content check of that id), read with the project's integrity module. Empty when
    it held."""
    run_dir = Path(run_dir)
    try:
        run = RunDir.open(run_dir)
        scan = integrity.scan_for_writer(run_dir)
    except (UserError, OSError, ValueError) as exc:
        return [f"unreadable: {str(exc).splitlines()[0]}"]
    problems = []
    for name in (EPISODES_FILE, SIDECAR_FILE):
        path = run_dir / name
        size = path.stat().st_size if path.exists() else 0
        if size != scan.complete_length[name]:
            problems.append(f"{name}: torn last line ({size - scan.complete_length[name]} bytes)")
        problems += [f"{name}:{b.lineno}: {b.reason}" for b in run.invalid_lines(name)]
    counts = Counter(scan.episode_ids)
    problems += [f"episode {eid} written {n} times" for eid, n in sorted(counts.items()) if n > 1]
    problems += [f"episode {eid} lost" for eid in sorted(set(expected) - set(counts))]
    problems += [f"episode {eid} not planned" for eid in sorted(set(counts) - set(expected))]
    if scan.orphan_tail_rows:
        problems.append(f"{scan.orphan_tail_rows} sidecar row(s) of no finished episode")
    problems += [f"episode {eid}: {n} call(s) without a sidecar row" for eid, n in sorted(scan.missing_rows.items())]
    sum(1 for _ in run.sidecar())
    if run.duplicate_sidecar_rows:
        problems.append(f"{run.duplicate_sidecar_rows} duplicate sidecar row(s)")
    for ep in run.episodes():
        want = expected.get(ep.episode_id)
        if want is not None and episode_signature(ep) != want:
            problems.append(f"episode {ep.episode_id}: bad data {episode_signature(ep)[:3]} != reference {want[:3]}")
    leftover = sorted(p.name for p in (run_dir / "checkpoints").glob("*.json")) if (run_dir / "checkpoints").is_dir() else []
    if leftover:
        problems.append(f"{len(leftover)} checkpoint(s) left after the run finished")
    return problems


def expected_judgments(judge_dir: Path) -> dict[tuple, int | None]:
    return {j.key: j.score for j in JudgeDir.open(judge_dir).judgments()}


def check_judge_dir(judge_dir: Path, expected: dict[tuple, int | None]) -> list[str]:
    """As :func:`check_run_dir` for a judge directory: exactly the expected judgments, once each, whole, equal."""
    judge_dir = Path(judge_dir)
    try:
        jd = JudgeDir.open(judge_dir)
        judgments = jd.judgments()
    except (UserError, OSError, ValueError) as exc:
        return [f"unreadable: {str(exc).splitlines()[0]}"]
    problems = []
    path = judge_dir / JUDGMENTS_FILE
    if path.stat().st_size != jd.complete_length():
        problems.append(f"{JUDGMENTS_FILE}: torn last line")
    if jd.duplicate_lines:
        problems.append(f"{jd.duplicate_lines} judgment(s) written twice")
    got = {j.key: j.score for j in judgments}
    problems += [f"judgment {k} lost" for k in sorted(set(expected) - set(got))]
    problems += [f"judgment {k} not planned" for k in sorted(set(got) - set(expected))]
    problems += [f"judgment {k}: score {got[k]} != reference {expected[k]}" for k in sorted(set(got) & set(expected))
                 if got[k] != expected[k]]
    return problems


# ----------------------------------------------------------------------------------------------- processes


class Campaign:
    """The work directory, the environment of every ``uqh`` subprocess, and the commands' transcripts."""

    def __init__(self, work: Path, seed: int):
        self.work = work
        self.rng = random.Random(seed)
        self.env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        self.env.update(PYTHONPATH=str(ROOT), LITELLM_LOCAL_MODEL_COST_MAP="True")
        self.outputs: list[str] = []  # every stdout/stderr, for the secrets check

    def server(self, faults: str = "", rate: float = 0.0, latency: float = 0.05, seed: int = 0) -> FakeServerProcess:
        return FakeServerProcess([PY, str(ROOT / "benchmarks" / "fake_server_process.py"), "--port", "0",
                                  "--latency", str(latency), "--faults", faults, "--fault-rate", str(rate),
                                  "--seed", str(seed), "--timeout-sleep", "4"])

    def uqh(self, argv: list[str], *, env: dict | None = None, cwd: Path | None = None,
            timeout: float = 900) -> subprocess.CompletedProcess:
        done = subprocess.run([PY, "-m", "uqh.cli", *argv], cwd=cwd or self.work, env=env or self.env,
                              capture_output=True, text=True, timeout=timeout)
        self.outputs += [done.stdout, done.stderr]
        return done

    def start(self, argv: list[str]) -> subprocess.Popen:
        return subprocess.Popen([PY, "-m", "uqh.cli", *argv], cwd=self.work, env=self.env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def show(argv: list[str]) -> str:
    """A command line for the report: the port and temporary paths replaced by placeholders."""
    text = " ".join(argv)
    text = re.sub(r"http://127\.0\.0\.1:\d+/v1", "http://127.0.0.1:$P/v1", text)
    return "uqh " + re.sub(r"/\S*/fault-campaign-\w+/", "", text)


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)


def describe(pids: list[int]) -> str:
    """``pid: first words of its command line`` for each of ``pids``."""
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = "?"
        out.append(f"{pid}: {cmd[:60].strip()}")
    return "; ".join(out)


def wait_gone(pids, deadline_s: float = 15.0) -> list[int]:
    """Wait until none of ``pids()`` is alive (workers notice a killed parent on their own); those still alive
    after ``deadline_s``."""
    end = time.monotonic() + deadline_s
    while True:
        running = sorted(p for p in pids() if alive(p))
        if not running or time.monotonic() > end:
            return running
        time.sleep(0.2)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def group_pids(pgid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.getpgid(int(d.name)) == pgid:
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def complete_lines(path: Path) -> int:
    if not path.exists():
        return 0
    return path.read_bytes()[: integrity.complete_length(path)].count(b"\n")


# ----------------------------------------------------------------------------------------------- kill -9


@dataclass
class KillMode:
    name: str
    argv: list[str]  # with "{out}" for the output directory
    records: str  # the file whose lines are the finished records
    check: object  # (out_dir) -> problems
    group: bool = False  # kill the whole process group, not only the parent
    duration_s: float = 0.0  # of the fault-free reference


def kill_modes(c: Campaign, url: str, src: Path, tasks: int, kills: int) -> list[KillMode]:
    """The five modes, each with its fault-free reference run (made here: it gives the expected records and the
    duration the kill moments are drawn from)."""
    run = ["run", "--domain", "arithmetic", "--model", "openai/agent", "--api-base", url, "--tasks", str(tasks),
           "--step-budget", "3", "--concurrency", "4", "--no-progress", "--out", "{out}"]
    cont = ["continue", str(src), "--branches", "3", "--prefixes", "6", "--concurrency", "4", "--bootstrap", "20",
            "--no-progress", "--out", "{out}"]
    judge = ["judge", str(src), "--judge-model", "openai/judge", "--api-base", url, "--metrics", "GF,EE,TC",
             "--limit", str(max(4, tasks // 3)), "--concurrency", "4", "--no-progress", "--out", "{out}"]
    expected_src = {f"arith-{i:04d}#0": expected_episodes(src)[f"arith-{i:04d}#0"] for i in range(tasks)}
    modes = [KillMode(KILL_MODES[0], run, EPISODES_FILE, lambda d: check_run_dir(d, expected_src)),
             KillMode(KILL_MODES[1], run[:-2] + ["--workers", "2"] + run[-2:], EPISODES_FILE,
                      lambda d: check_run_dir(d, expected_src)),
             KillMode(KILL_MODES[2], run[:-2] + ["--workers", "2"] + run[-2:], EPISODES_FILE,
                      lambda d: check_run_dir(d, expected_src), group=True),
             KillMode(KILL_MODES[3], cont, EPISODES_FILE, None),
             KillMode(KILL_MODES[4], judge, JUDGMENTS_FILE, None)]
    for mode in modes[:max(1, min(kills, len(modes)))]:  # a reference for each mode the kills will use
        ref = c.work / "reference" / re.sub(r"\W+", "-", mode.name)
        t0 = time.monotonic()
        done = c.uqh([a.replace("{out}", str(ref)) for a in mode.argv])
        mode.duration_s = time.monotonic() - t0
        if done.returncode != 0:
            raise RuntimeError(f"reference {mode.name} failed: {done.stderr.strip()[-300:]}")
        if mode.check is None and mode.name == "continue":
            expected_cont = expected_episodes(ref)
            mode.check = lambda d, e=expected_cont: check_run_dir(d, e)
        elif mode.check is None:
            expected_j = expected_judgments(ref)
            mode.check = lambda d, e=expected_j: check_judge_dir(d, e)
    return modes


def kill_once(c: Campaign, mode: KillMode, out: Path) -> tuple[list[str], dict]:
    """Start ``mode`` into ``out``, kill -9 it at a random moment, run the same command again, check."""
    argv = [a.replace("{out}", str(out)) for a in mode.argv]
    for _ in range(4):  # a kill drawn after the command already ended is drawn again, earlier
        shutil.rmtree(out, ignore_errors=True)
        at = c.rng.uniform(0.2, 0.95) * mode.duration_s
        proc = c.start(argv)
        time.sleep(at)
        if proc.poll() is None:
            break
        mode.duration_s *= 0.7
    else:
        return ["the command always finished before the kill"], {}
    members = group_pids(proc.pid)
    if mode.group:
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    survivors = wait_gone(lambda: set(members) | set(group_pids(proc.pid)))
    seen = describe(survivors)
    for pid in survivors:  # reported below, then ended so that they do not pile up
        os.kill(pid, signal.SIGKILL)
    path = out / mode.records
    info = {"at_s": round(at, 2), "records_at_kill": complete_lines(path),
            "torn_bytes": (path.stat().st_size - integrity.complete_length(path)) if path.exists() else 0,
            "survivors": len(survivors)}
    problems = [f"{len(survivors)} process(es) of the killed command still running 15 s after the kill "
                f"({seen})"] if survivors else []
    done = c.uqh(argv)
    if done.returncode != 0:
        return problems + [f"the re-run exited {done.returncode}: {done.stderr.strip()[-300:]}"], info
    return problems + mode.check(out), info


def kill_campaign(c: Campaign, url: str, src: Path, tasks: int, kills: int) -> Category:
    modes = kill_modes(c, url, src, tasks, kills)[:max(1, min(kills, len(KILL_MODES)))]
    cat = Category("kill -9, then the same command", show([a.replace("{out}", "OUT") for a in modes[0].argv]))
    landed = Counter()
    for i in range(kills):
        mode = modes[i % len(modes)]
        problems, info = kill_once(c, mode, c.work / "kills" / f"{i:03d}")
        cat.record(f"kill {i} ({mode.name}, at {info.get('at_s')} s)", problems)
        landed[mode.name] += 1
        n = info.get("records_at_kill", 0)
        landed["mid-run" if n else "before the first record"] += 1
        landed["torn line left"] += bool(info.get("torn_bytes"))
        landed["processes left running"] += bool(info.get("survivors"))
    cat.numbers = {"kills per mode": {m.name: landed[m.name] for m in modes},
                   "kills after some records were written": landed["mid-run"],
                   "kills before the first record": landed["before the first record"],
                   "kills that left a torn line": landed["torn line left"],
                   "kills after which processes of the command still ran 15 s later": landed["processes left running"],
                   "fault-free duration per mode (s)": {m.name: round(m.duration_s, 1) for m in modes}}
    cat.details = [f"`{show([a.replace('{out}', 'OUT') for a in m.argv])}`" + (" (killpg)" if m.group else "")
                   for m in modes]
    return cat


# ----------------------------------------------------------------------------------------------- fault types


def summary_number(text: str, pattern: str) -> int:
    m = re.search(pattern, text)
    return int(m.group(1).replace(",", "")) if m else 0


def fault_campaign(c: Campaign, src: Path, episodes: int, rate: float, kinds: list[str]) -> Category:
    expected_all = expected_episodes(src)
    expected = {f"arith-{i:04d}#0": expected_all.get(f"arith-{i:04d}#0") for i in range(episodes)}
    argv = ["run", "--domain", "arithmetic", "--model", "openai/agent", "--api-base", "{url}", "--tasks",
            str(episodes), "--step-budget", "3", "--concurrency", "8", "--timeout", "2", "--no-progress",
            "--out", "{out}"]
    cat = Category(f"fault types at {rate:.0%} of requests, re-run until done",
                   show([a.replace("{out}", "OUT").replace("{url}", "http://127.0.0.1:0/v1") for a in argv]))
    for k, kind in enumerate(kinds):
        out = c.work / "faults" / kind
        passes, infra, nulls, no_lp, problems = 0, 0, 0, 0, []
        with c.server(kind, rate, seed=k) as srv:
            cmd = [a.replace("{out}", str(out)).replace("{url}", srv.base_url) for a in argv]
            while passes < MAX_PASSES:
                passes += 1
                done = c.uqh(cmd)
                infra += summary_number(done.stdout, r"infra errors\s+(\d+) this run")
                nulls += summary_number(done.stdout, r"(\d+) with null content")
                no_lp += summary_number(done.stdout, r"\(([\d,]+) without logprobs")
                if done.returncode == 0:
                    break
                if done.returncode != 1 or "re-run the same command to resume" not in done.stderr:
                    problems.append(f"pass {passes} exited {done.returncode}: {done.stderr.strip()[-200:]}")
                    break
            else:
                problems.append(f"not finished after {MAX_PASSES} passes")
            stats = srv.stats()
        problems += check_run_dir(out, expected)
        cat.record(kind, problems)
        cat.details.append(f"{kind}: {stats['faults'].get(kind, 0)} faults in {stats['requests']} requests; "
                           f"{passes} pass(es); {infra} infra error(s) re-queued; {nulls} null-content call(s); "
                           f"{no_lp} call(s) without logprobs; {'held' if not problems else 'FAILED'}")
    cat.numbers = {"episodes per fault type": episodes, "fault rate": rate}
    return cat


# ----------------------------------------------------------------------------------------------- load, breaker


def load_campaign(c: Campaign, src: Path, concurrency: int, episodes: int, latency: float) -> Category:
    samples = -(-episodes // 1000)  # the arithmetic domain has 1,000 tasks
    tasks = episodes // samples
    ref = expected_episodes(src)
    expected = {f"arith-{i:04d}#{s}": ref.get(f"arith-{i:04d}#0") for i in range(tasks) for s in range(samples)}
    argv = ["run", "--domain", "arithmetic", "--model", "openai/agent", "--api-base", "{url}", "--tasks", str(tasks),
            "--samples", str(samples), "--step-budget", "3", "--concurrency", str(concurrency), "--no-progress",
            "--out", "{out}"]
    cat = Category(f"load: C = {concurrency} x {tasks * samples:,} episodes",
                   show([a.replace("{out}", "OUT").replace("{url}", "http://127.0.0.1:0/v1") for a in argv]))
    out = c.work / "load"
    with c.server(latency=latency) as srv:
        t0 = time.monotonic()
        done = c.uqh([a.replace("{out}", str(out)).replace("{url}", srv.base_url) for a in argv])
        wall = time.monotonic() - t0
        requests = srv.stats()["requests"]
    problems = [] if done.returncode == 0 else [f"exited {done.returncode}: {done.stderr.strip()[-200:]}"]
    problems += check_run_dir(out, expected)
    cat.record("load", problems)
    cat.numbers = {"episodes": tasks * samples, "concurrency": concurrency, "server latency (s)": latency,
                   "model calls": requests, "wall seconds (command, start-up included)": round(wall, 1),
                   "calls/s": round(requests / wall, 1), "episodes/s": round(tasks * samples / wall, 1)}
    return cat


def breaker_campaign(c: Campaign, failures: int | None, window: float | None) -> Category:
    argv = ["run", "--domain", "arithmetic", "--model", "openai/agent", "--api-base", "{url}", "--tasks", "40",
            "--concurrency", "8", "--no-progress", "--out", "{out}"]
    if failures is not None:
        argv[-2:-2] = ["--breaker-failures", str(failures)]
    if window is not None:
        argv[-2:-2] = ["--breaker-window", str(window)]
    window_s = 120.0 if window is None else window
    bound = 1.5 * window_s + 30  # the window, then calls in flight finishing their backoff (60 s cap) at worst
    cat = Category("circuit breaker: every request answered 500",
                   show([a.replace("{out}", "OUT").replace("{url}", "http://127.0.0.1:0/v1") for a in argv]))
    out = c.work / "breaker"
    with c.server("500", 1.0) as srv:
        t0 = time.monotonic()
        done = c.uqh([a.replace("{out}", str(out)).replace("{url}", srv.base_url) for a in argv])
        wall = time.monotonic() - t0
        requests = srv.stats()["requests"]
    err = done.stderr.strip().splitlines()
    problems = [] if done.returncode == 1 else [f"exit {done.returncode}, not 1"]
    if len(err) != 1 or "re-run the same command to resume" not in err[0]:
        problems.append(f"stderr is not one line with the resume hint: {done.stderr.strip()[-300:]!r}")
    if wall > bound:
        problems.append(f"stopped after {wall:.0f} s (> {bound:.0f} s)")
    problems += check_run_dir(out, {})  # nothing written as data, and the directory whole
    cat.record("breaker", problems)
    cat.numbers = {"breaker window (s)": window_s, "breaker failures": failures or 12,
                   "seconds to stop (command, start-up included)": round(wall, 1), "requests to stop": requests,
                   "bound (s)": bound, "stderr": err[:1]}
    return cat


# ----------------------------------------------------------------------------------------------- secrets

CANARY_LETTERS = "ghjkmnpqrstuvwxyzGHJKMNPQRSTUVWXYZ"  # no hex digit: a piece cannot occur in a hash by chance


def make_canary(rng: random.Random) -> str:
    return "sk-CANARY" + "".join(rng.choice(CANARY_LETTERS) for _ in range(24))


def leaks(canary: str, texts: list[str], dirs: list[Path], given: tuple[Path, ...] = ()) -> list[str]:
    """Where ``canary``, its ``CANARY`` part, or any 8-character piece of its random part occurs in ``texts`` or
    any file under ``dirs`` (but the files the campaign ``given`` it in)."""
    tail = canary[len("sk-CANARY"):]
    pieces = [canary.encode(), b"CANARY"] + [tail[i:i + 8].encode() for i in range(len(tail) - 7)]
    found = [f"output {i}" for i, t in enumerate(texts) if any(p in t.encode() for p in pieces)]
    for d in dirs:
        for path in (p for p in Path(d).rglob("*") if p.is_file() and p not in given):
            data = path.read_bytes()
            if any(p in data for p in pieces):
                found.append(str(path))
    return found


def secrets_campaign(c: Campaign) -> Category:
    """A canary key every way one arrives; every output and every file written searched for it."""
    cat = Category("secrets canary (env, .env, echoed error body; every URL shape every way a URL is taken; -v)",
                   "uqh -v run/continue/judge/report ... with OPENAI_API_KEY=CANARY (env or ./.env) against a server "
                   "whose 500s echo the Authorization header; u:CANARY@, u:pa/CANARY@ (no scheme), ;api_key=CANARY, "
                   "?api_key=CANARY, #CANARY in --api-base, --endpoints, --user-api-base, --es-url, -D es_url=, "
                   "continue/judge/probe --api-base, index --es-url")
    work = c.work / "secrets"
    work.mkdir(parents=True)
    given = (work / "dotenv" / ".env",)  # the one file the campaign writes a key into
    with c.server("echo_key", 0.3, seed=7) as srv:
        url = srv.base_url
        for way in ("env", ".env"):
            canary = make_canary(c.rng)
            cwd = work / ("env-var" if way == "env" else "dotenv")
            cwd.mkdir()
            env = dict(c.env)
            if way == "env":
                env["OPENAI_API_KEY"] = canary
            else:
                (cwd / ".env").write_text(f"OPENAI_API_KEY={canary}\n")
            commands = {
                "run": ["-v", "run", "--domain", "arithmetic", "--model", "openai/agent", "--api-base", url,
                        "--tasks", "6", "--step-budget", "3", "--no-progress", "--out", "run"],
                "continue": ["-v", "continue", "run", "--branches", "2", "--prefixes", "2", "--bootstrap", "20",
                             "--no-progress", "--out", "cont"],
                "judge": ["-v", "judge", "run", "--judge-model", "openai/judge", "--api-base", url, "--metrics", "GF",
                          "--no-progress", "--out", "judge"],
                "report": ["-v", "report", "run", "--bootstrap", "20", "--out", "report"],
            }
            for name, argv in commands.items():
                texts, echoed = [], 0
                for _ in range(MAX_PASSES):  # echoed errors are infrastructure errors: re-run until done
                    done = c.uqh(argv, env=env, cwd=cwd)
                    texts += [done.stdout, done.stderr]
                    echoed += len(re.findall(r"rejected Bearer \*\*\*", done.stderr))
                    if done.returncode != 1:
                        break
                problems = [f"exit {done.returncode}: {done.stderr.strip()[-200:]}"] if done.returncode else []
                problems += [f"leaked in {w}" for w in leaks(canary, texts, [cwd], given)]
                cat.record(f"{way} key, {name}", problems)
                cat.details.append(f"{way} key, `uqh -v {name}`: {echoed} echoed key(s) logged redacted "
                                   "(`rejected Bearer ***`)")
            cat.record(f"{way} key, every file and output so far", [f"leaked in {w}" for w in
                                                                    leaks(canary, c.outputs, [work], given)])
        src = work / "env-var" / "run"
        for shape, ways in url_ways(url, src, work).items():
            canary = make_canary(c.rng)
            endpoints = c.work / "given" / f"endpoints-{re.sub(r'[^a-z]+', '-', shape)}.txt"  # outside what is searched
            endpoints.parent.mkdir(exist_ok=True)
            endpoints.write_text(URL_SHAPES[shape](url, canary) + "\n")
            for name, argv in ways.items():
                argv = [a.replace("{url}", URL_SHAPES[shape](url, canary)).replace("{file}", str(endpoints))
                        for a in argv]
                done = c.uqh(argv)
                out_dir = Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
                problems = []
                comment = shape == "fragment" and "--endpoints" in argv  # "#" starts a comment in that file
                if not comment:
                    problems += [] if done.returncode == 2 else [f"exit {done.returncode}, not 2 (refused)"]
                    if len(done.stderr.strip().splitlines()) != 1:
                        problems.append(f"stderr is not one line: {done.stderr.strip()[-200:]!r}")
                    if out_dir is not None and out_dir.exists():
                        problems.append(f"{out_dir.name} was written")
                problems += [f"leaked in {w}" for w in leaks(canary, [done.stdout, done.stderr], [work], given)]
                cat.record(f"URL {shape}, {name}", problems)
    cat.numbers = {"canary leaks": sum("leaked in" in f for f in cat.failures)}
    return cat


#: Every credential-bearing part of a URL, as (base URL, canary) -> URL.
URL_SHAPES = {
    "userinfo": lambda url, k: url.replace("//", f"//u:{k}@"),
    "malformed userinfo": lambda url, k: url.replace("http://", f"u:pa/{k}@"),
    "path parameter": lambda url, k: f"{url};api_key={k}",
    "query": lambda url, k: f"{url}?api_key={k}",
    "fragment": lambda url, k: f"{url}#{k}",
}


def url_ways(url: str, src: Path, work: Path) -> dict[str, dict[str, list[str]]]:
    """Per URL shape, every way the CLI takes a URL: ``{url}`` the URL, ``{file}`` an endpoints file holding it."""
    out = {}
    for shape in URL_SHAPES:
        slug = re.sub(r"\W+", "-", shape)
        o = lambda name, slug=slug: str(work / f"{slug}-{name}")  # noqa: E731
        run = ["-v", "run", "--domain", "arithmetic", "--model", "openai/agent", "--tasks", "2"]
        qa = ["-v", "run", "--domain", "hotpotqa", "--model", "openai/agent", "--api-base", url, "--tasks", "1"]
        out[shape] = {
            "run --api-base": [*run, "--api-base", "{url}", "--out", o("run")],
            "run --endpoints": [*run, "--endpoints", "{file}", "--out", o("run-endpoints")],
            "run --user-api-base": [*run, "--api-base", url, "--user-model", "openai/u", "--user-api-base", "{url}",
                                    "--out", o("run-user")],
            "run --es-url": [*qa, "--retrieval", "es", "--es-index", "x", "--es-url", "{url}", "--out", o("run-es")],
            "run -D es_url=": [*qa, "-D", "es_url={url}", "--out", o("run-d")],
            "continue --api-base": ["-v", "continue", str(src), "--api-base", "{url}", "--out", o("cont")],
            "judge --api-base": ["-v", "judge", str(src), "--judge-model", "openai/judge", "--api-base", "{url}",
                                 "--out", o("judge")],
            "probe --api-base": ["-v", "probe", str(src), "--probe", "p_true", "--model", "openai/agent",
                                 "--api-base", "{url}", "--out", o("probe")],
            "index --es-url": ["-v", "index", "--corpus", str(src / "manifest.json"), "--backend", "es",
                               "--es-index", "x", "--es-url", "{url}"],
        }
    return out


# ----------------------------------------------------------------------------------------------- bad inputs


def classify(done: subprocess.CompletedProcess, *, want_exit: int = 2, fragment: str = "",
             one_line: bool = True) -> list[str]:
    """How a command's answer to a bad input differs from one line on stderr (containing ``fragment``), exit
    ``want_exit``, nothing on stdout; "traceback" and "wrong exit 0" are named so that they can be counted.
    ``one_line=False``: stderr may hold several lines (the help of ``uqh`` without a command)."""
    problems = []
    if "Traceback (most recent call last)" in done.stderr + done.stdout:
        problems.append("traceback")
    if done.returncode == 0 and want_exit != 0:
        problems.append("wrong exit 0")
    elif done.returncode != want_exit:
        problems.append(f"exit {done.returncode}, not {want_exit}")
    lines = done.stderr.strip().splitlines() if one_line else [done.stderr]
    if len(lines) != 1:
        problems.append(f"{len(lines)} stderr lines")
    elif fragment and fragment not in lines[0]:
        problems.append(f"the line does not say {fragment!r}: {lines[0][:160]!r}")
    if done.stdout.strip():
        problems.append(f"stdout: {done.stdout.strip()[:80]!r}")
    return problems


def input_fixtures(root: Path) -> dict[str, str]:
    """The files the sweep's placeholders name (as tests/test_bad_inputs.py makes them), under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / "tests" / "data" / "pre_rundir_run", root / "run")
    (root / "bin.dat").write_bytes(bytes(range(256)) * 4)
    (root / "empty.txt").write_text("")
    (root / "afile").write_text("not what was expected\n")
    (root / "nonempty").mkdir()
    (root / "nonempty" / "notes.txt").write_text("someone's notes\n")
    return {"{nonempty}": str(root / "nonempty"), "{run}": str(root / "run"), "{bin}": str(root / "bin.dat"),
            "{empty}": str(root / "empty.txt"), "{missing}": str(root / "missing"), "{afile}": str(root / "afile")}


def tree_digest(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def input_campaign(c: Campaign, every: int, worker_runs: int) -> Category:
    """The sweep's bad inputs (every ``every``-th) and the subprocess-only cases, each as a real CLI call."""
    from test_bad_inputs import CASES

    cat = Category("bad inputs: one line, exit 2, nothing written (the sweep's cases and more, as subprocesses)",
                   "uqh <each case of tests/test_bad_inputs.py>; LITELLM_LOG=bogus|''; uqh -v with litellm; "
                   "--workers 2 on an unreachable endpoint; uqh -v alone; an empty run under 7 commands")
    root = c.work / "inputs"
    subst = input_fixtures(root)
    before = tree_digest(root)

    def sub(text: str) -> str:
        for key, value in subst.items():
            text = text.replace(key, value)
        return text

    for argv, fragment in CASES[::every]:
        done = c.uqh([sub(a) for a in argv], cwd=root, timeout=300)
        problems = classify(done, fragment=sub(fragment))
        if tree_digest(root) != before:
            problems.append("wrote or touched files")
            shutil.rmtree(root)
            subst = input_fixtures(root)
        cat.record(" ".join(argv)[:80], problems)
    for label, argv, env, want, fragment in extra_input_cases(c, root):
        done = c.uqh(argv, env={**c.env, **env}, cwd=root, timeout=300)
        problems = classify(done, want_exit=want, fragment=fragment, one_line=argv != ["-v"])
        cat.record(label, problems)
    for i in range(worker_runs):  # the worker traceback came in 2 of 5 runs
        out = root / f"workers-{i}"
        done = c.uqh(["run", "--domain", "arithmetic", "--model", "openai/x", "--api-base", "http://127.0.0.1:9/v1",
                      "--tasks", "50", "--concurrency", "16", "--workers", "2", "--no-progress", "--out", str(out)],
                     cwd=root, timeout=300)
        done.stdout = ""  # the summary is the documented stdout of an unfinished run
        cat.record(f"--workers 2, unreachable endpoint, run {i + 1}",
                   classify(done, want_exit=1, fragment="cannot reach"))
        shutil.rmtree(out, ignore_errors=True)
    count = lambda kind: sum(kind in f for f in cat.failures)  # noqa: E731
    cat.numbers = {"cases": cat.tried, "tracebacks": count("traceback"), "wrong exit 0s": count("wrong exit 0"),
                   "other deviations": sum(1 for f in cat.failures if "traceback" not in f and "wrong exit 0" not in f),
                   "sweep cases run": len(CASES[::every]), "sweep cases in all": len(CASES)}
    return cat


def extra_input_cases(c: Campaign, root: Path) -> list[tuple[str, list[str], dict, int, str]]:
    """(label, argv, environment, expected exit, fragment of the line) of what the in-process sweep cannot do."""
    litellm = ["run", "--domain", "arithmetic", "--tasks", "1", "--model", "anthropic/claude-3-haiku-20240307",
               "--out", str(root / "never"), "--dry-run"]
    empty = root / "empty-run"
    empty.mkdir(exist_ok=True)
    shutil.copy(ROOT / "tests" / "data" / "pre_rundir_run" / "manifest.json", empty / "manifest.json")
    url = "http://127.0.0.1:9/v1"
    cases = [("LITELLM_LOG=bogus", litellm, {"LITELLM_LOG": "bogus"}, 2, "is not a log level"),
             ("LITELLM_LOG set but empty", litellm, {"LITELLM_LOG": ""}, 2, "ANTHROPIC_API_KEY"),
             ("uqh -v, litellm imported: nothing on stdout", ["-v", *litellm], {}, 2, "ANTHROPIC_API_KEY"),
             ("uqh -v without a command: the help on stderr", ["-v"], {}, 2, "usage: uqh"),
             ("report --certify a binary file", ["report", str(root / "run"), "--out", str(root / "r"), "--certify",
                                                 str(root / "bin.dat")], {}, 2, "not a UTF-8 text file")]
    for argv in (["score"], ["certify"], ["report", "--out", str(root / "r")], ["audit"], ["export", "--to",
                 str(root / "e")], ["judge", "--judge-model", "openai/j", "--api-base", url, "--out", str(root / "j")],
                 ["probe", "--probe", "p_true", "--model", "openai/p", "--api-base", url, "--out", str(root / "p")]):
        cases.append((f"{argv[0]} of an empty run", [argv[0], str(empty), *argv[1:]], {}, 2, "no finished episode"))
    return cases


# ----------------------------------------------------------------------------------------------- report


def write_results(categories: list[Category], meta: dict, out: Path) -> None:
    lines = [f"# Fault campaign (`benchmarks/fault_campaign.py`)", "",
             f"Command: `{meta['command']}`", "",
             f"Measured {meta['date']} on {meta['machine']}; 1-min load average {meta['load_start']} at start, "
             f"{meta['load_end']} at end (other work shares the machine); {meta['wall_s']:.0f} s in all. "
             f"Sizes: {meta['sizes']}.", "",
             "Every command is the real CLI in a subprocess against the fault server of "
             "`benchmarks/fake_server_process.py` in its own process; verdicts use `uqh.rundir` (RunDir, "
             "integrity.scan_for_writer, JudgeDir) and compare every record with a fault-free reference run.", "",
             "| category | tried | held | command |", "|---|---:|---:|---|"]
    lines += [f"| {c.name} | {c.tried} | {c.held} | `{c.command}` |" for c in categories]
    for c in categories:
        lines += ["", f"## {c.name}", ""]
        lines += [f"- {k}: {v}" for k, v in c.numbers.items()]
        lines += [f"- {d}" for d in c.details]
        lines += [f"- **FAILED** {f}" for f in c.failures] or ["- no failure"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "categories": [asdict(c) for c in categories]},
                                                   indent=2) + "\n")


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (a few minutes)")
    p.add_argument("--kills", type=int, help="kill -9 trials (default 40; quick 5)")
    p.add_argument("--tasks", type=int, help="tasks of the killed runs (default 40; quick 8)")
    p.add_argument("--fault-episodes", type=int, help="episodes per fault type (default 50; quick 6)")
    p.add_argument("--fault-rate", type=float, default=0.2, help="fraction of requests faulted (default 0.2)")
    p.add_argument("--fault-types", default=",".join(FAULTS), help="comma-separated (default: all the server plays)")
    p.add_argument("--load-concurrency", type=int, help="default 256; quick 32")
    p.add_argument("--load-episodes", type=int, help="default 2000; quick 64")
    p.add_argument("--load-latency", type=float, default=0.2, help="server latency of the load run (default 0.2 s)")
    p.add_argument("--breaker-failures", type=int, help="default: uqh's (12)")
    p.add_argument("--breaker-window", type=float, help="default: uqh's (120 s); quick 3")
    p.add_argument("--input-every", type=int, help="run every N-th case of the bad-input sweep (default 1; quick 10)")
    p.add_argument("--worker-runs", type=int, help="unreachable-endpoint runs with --workers 2 (default 5; quick 2)")
    p.add_argument("--only", default="kills,faults,load,breaker,secrets,inputs", help="categories to run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, help="keep the run directories here (default: a temporary directory)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fault_campaign.md")
    args = p.parse_args(argv)
    quick = args.quick
    defaults = dict(kills=(40, 5), tasks=(40, 8), fault_episodes=(50, 6), load_concurrency=(256, 32),
                    load_episodes=(2000, 64), breaker_window=(None, 3.0), input_every=(1, 10), worker_runs=(5, 2))
    for name, (full, small) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    only = set(args.only.split(","))
    t0, load_start = time.monotonic(), load_average()
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fault-campaign-", dir=args.work))
    c = Campaign(work, args.seed)
    categories: list[Category] = []
    cmd = "python benchmarks/fault_campaign.py " + " ".join(argv if argv is not None else sys.argv[1:])
    sizes = (f"{args.kills} kills of {args.tasks}-task runs; {args.fault_episodes} episodes per fault type at "
             f"{args.fault_rate:.0%}; load C={args.load_concurrency} x {args.load_episodes}; breaker window "
             f"{args.breaker_window or 120} s")

    def finished(cat: Category) -> None:  # written after each category, so a long campaign keeps what it measured
        categories.append(cat)
        print(f"{cat.name}: {cat.held}/{cat.tried} held ({time.monotonic() - t0:.0f} s)", flush=True)
        for f in cat.failures:
            print(f"  FAILED {f}", flush=True)
        meta = {"command": cmd.strip(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
                "load_start": load_start, "load_end": load_average(), "wall_s": time.monotonic() - t0,
                "sizes": sizes, "held": all(x.held == x.tried for x in categories)}
        write_results(categories, meta, args.out)

    try:
        src = work / "src"
        with c.server() as srv:
            src_argv = ["run", "--domain", "arithmetic", "--model", "openai/agent", "--api-base", srv.base_url,
                        "--tasks", str(max(args.tasks, args.fault_episodes)), "--step-budget", "3", "--no-progress",
                        "--out", str(src)]
            if c.uqh(src_argv).returncode != 0:
                raise RuntimeError("the fault-free source run failed")
            if "kills" in only:
                finished(kill_campaign(c, srv.base_url, src, args.tasks, args.kills))
        if "faults" in only:
            kinds = [k for k in args.fault_types.split(",") if k]
            finished(fault_campaign(c, src, args.fault_episodes, args.fault_rate, kinds))
        if "load" in only:
            finished(load_campaign(c, src, args.load_concurrency, args.load_episodes, args.load_latency))
        if "breaker" in only:
            finished(breaker_campaign(c, args.breaker_failures, args.breaker_window))
        if "secrets" in only:
            finished(secrets_campaign(c))
        if "inputs" in only:
            finished(input_campaign(c, args.input_every, args.worker_runs))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if all(x.held == x.tried for x in categories) else 1


if __name__ == "__main__":
    sys.exit(main())

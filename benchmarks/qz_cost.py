"""Monte Carlo q_Z at fewer calls: the sequential stop rule (``--stop-rule ci:H``) against fixed M (issue 19).

    .venv/bin/python benchmarks/qz_cost.py [--prefixes 200] [--branches 10] [--half-widths 0.1,0.2,0.3,0.4]
        [--sim-prefixes 20000] [--out benchmarks/results/qz_cost.md]

**Part 1, end to end** (``uqh continue`` through the real runner and the fake server of ``tests/``): a source run of
N arithmetic prefixes that all stop on ``max_steps``; prefix i has the true continuation-success probability
``q_i = (i + 0.5) / N``, spread evenly over [0, 1]. The fake server reads the prefix from the question in the
request and answers the right number iff ``u < q_i``, ``u`` drawn by a RNG seeded with the branch's decoding seed,
so branch k of a prefix has the same outcome whichever rule runs it. ``uqh continue`` runs once with
``--stop-rule fixed`` (M = ``--branches``) and once per ``ci:H`` (maximum M). Reported per run: model calls
(counted by the server), branches, coverage of the true q by the interval recorded in ``qz.jsonl``, the mean
absolute error of q_hat against the true q and against the fixed-M q_hat, and the prompt tokens the server's
OpenAI-style prefix cache served.

**Part 2, simulation**: the same decision function (``uqh.harness.sampling.branch_rules.decide``) on ``--sim-prefixes`` simulated
prefixes per distribution -- uniform q, and a Table 7-shaped one (67.8% of prefixes stuck, q ~ U[0, 0.02]; the
rest q ~ U[0.3, 1], so 23% above 0.5) -- for tight numbers. **Part 3**: the same rule against the fixed design of
equal guaranteed precision (the smallest M whose interval has half-width <= H at every outcome count).
**Part 4**: the floor for any rule at H = 0.1 -- oracles that know the q distribution, with each early interval
a 95% interval or with coverage only averaged over prefixes (exact, no sampling; closed forms checked in
``tests/test_qz_cost_bounds.py``).

Numbers are measured and written, never asserted.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import uqh  # noqa: E402,F401 - sets the litellm env before litellm is imported
from uqh.harness.sampling.branch_rules import StopRule, confidence_sequence, decide  # noqa: E402
from uqh.harness.config.settings import BatchSettings

CALC = "<think>keep going</think>\n<action>Calc[1+1]</action>\n<confidence>0.3</confidence>\n<explanation>e</explanation>"
FINISH = "<think>done</think>\n<action>Finish[{a}]</action>\n<confidence>0.9</confidence>\n<explanation>e</explanation>"


# ------------------------------------------------------------------------------------------ part 1: end to end


def unique_tasks(n: int) -> list[str]:
    """The first n arithmetic task ids with distinct questions (the server keys q on the question)."""
    from uqh.domains.arithmetic import make_question

    seen, out, i = set(), [], 0
    while len(out) < n:
        tid = f"arith-{i:04d}"
        q = make_question(tid)[0]
        if q not in seen:
            seen.add(q)
            out.append(tid)
        i += 1
    return out


class KnownQ:
    """Source mode: always Calc (every episode is censored). Branch mode: right iff U(seeded by the branch's decoding
    seed) < q of the prefix whose question the request carries."""

    def __init__(self, q_of_question: dict[str, float]):
        self.q = q_of_question
        self.mode = "source"

    def __call__(self, req: dict) -> str:
        if self.mode == "source":
            return CALC
        from uqh.domains.arithmetic import safe_eval

        question = req["messages"][1]["content"]
        answer = int(safe_eval(re.search(r"What is (.*)\?", question).group(1)))
        right = random.Random(req["seed"]).random() < self.q[question]
        return FINISH.format(a=answer if right else answer + 1)


def end_to_end(n_prefixes: int, max_branches: int, half_widths: list[float], concurrency: int) -> dict:
    from uqh.domains.domain_registry import get_domain_class
    from uqh.domains.arithmetic import make_question
    from fake_openai_server import FakeOpenAIServer
    from uqh.harness.continuation import run_continuations
    from uqh.harness.config.build import prompt_sha256
    from uqh.harness.runner import run_batch
    from uqh.reports.continuation_audit import audit_continuation
    from run_files import read_episodes
    from uqh.rundir.reader import RunDir
    from uqh.rundir.schema import DecodingConfig, RunConfig

    tasks = unique_tasks(n_prefixes)
    q_true = {f"{t}#0": (i + 0.5) / n_prefixes for i, t in enumerate(tasks)}
    responder = KnownQ({f"Question: {make_question(t)[0]}": q_true[f"{t}#0"] for t in tasks})
    work = Path(tempfile.mkdtemp(prefix="qz_cost_"))
    out: dict = {"prefixes": n_prefixes, "max_branches": max_branches, "runs": []}
    try:
        with FakeOpenAIServer(responder, prompt_cache=True, record_requests=False, latency_s=0.02) as srv:
            domain = get_domain_class("arithmetic")({})
            cfg = RunConfig(domain="arithmetic", task_ids=tasks, model="openai/fake", api_base=srv.base_url,
                            decoding=DecodingConfig(max_tokens=64, seed=42), step_budget=1,
                            prompt_sha256=prompt_sha256(domain.system_prompt()), package_version=uqh.__version__)
            assert run_batch(cfg, work / "src", settings=BatchSettings(progress=False, concurrency=concurrency)).ok
            responder.mode = "branch"
            fixed_q = None
            for rule in ["fixed"] + [f"ci:{h:g}" for h in half_widths]:
                before = srv.n_requests
                t0 = time.perf_counter()
                dest = work / rule.replace(":", "_")
                run_continuations(work / "src", dest, branches=max_branches, extra_steps=1, settings=BatchSettings(concurrency=concurrency, progress=False), stop_rule=rule)
                seconds = time.perf_counter() - t0
                calls = srv.n_requests - before
                est, _ = audit_continuation(dest, min_valid=1, method="mc", n_boot=200)
                recs = {r.episode_id: r for r in est.records}
                assert len(recs) == n_prefixes, "every prefix resolves in this design"
                q_hat = {e: r.q_hat_z for e, r in recs.items()}
                if rule == "fixed":
                    fixed_q = q_hat
                    # the fixed design records no interval: the same confidence sequence at n = M, for reference
                    intervals = {e: confidence_sequence(round(r.q_hat_z * r.n_valid), r.n_valid) for e, r in recs.items()}
                else:
                    intervals = {e: tuple(r.interval) for e, r in recs.items()}
                calls_list = [a.call for ep in read_episodes(dest) for st in ep.steps[ep.prefix_steps:] for a in st.attempts]
                cost = est.audit.cost
                out["runs"].append({
                    "rule": rule,
                    "calls": calls,
                    "branches": cost.branches,
                    "seconds": seconds,
                    "coverage": float(np.mean([intervals[e][0] <= q_true[e] <= intervals[e][1] for e in recs])),
                    "mean_half_width": float(np.mean([(hi - lo) / 2 for lo, hi in intervals.values()])),
                    "mae_true": float(np.mean([abs(q_hat[e] - q_true[e]) for e in recs])),
                    "mae_vs_fixed": float(np.mean([abs(q_hat[e] - fixed_q[e]) for e in recs])),
                    "prompt_tokens": cost.prompt_tokens,
                    "cached_prompt_tokens": cost.cached_prompt_tokens,
                    "first_calls_fully_cached": float(np.mean([
                        c.usage.cached_prompt_tokens == c.usage.prompt_tokens for c in calls_list])),
                    "stopped_early": sum(1 for d in RunDir.open(dest).stop_decisions().values()
                                         if d.branches < max_branches),
                })
                if rule != "fixed":  # a sequential run is a prefix of the fixed one: same branches, same outcomes
                    fixed_eps = {e.episode_id: e.outcome for e in read_episodes(work / "fixed")}
                    assert all(fixed_eps[e.episode_id] == e.outcome for e in read_episodes(dest))
                print(f"  {rule}: {calls} calls, {seconds:.1f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------------------ part 2: simulation


def draw_q(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "uniform":
        return rng.uniform(0.0, 1.0, n)
    stuck = rng.uniform(size=n) < 0.678
    return np.where(stuck, rng.uniform(0.0, 0.02, n), rng.uniform(0.3, 1.0, n))


def simulate(kind: str, n: int, max_branches: int, half_widths: list[float], seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    q = draw_q(kind, n, rng)
    y = (rng.uniform(size=(n, max_branches)) < q[:, None]).astype(int)
    fixed = y.mean(axis=1)
    rows = []
    for h in [None] + half_widths:
        rule = StopRule(h) if h is not None else StopRule()
        used, cover, est = np.empty(n), np.empty(n, bool), np.empty(n)
        for i in range(n):
            for target in rule.rounds(max_branches):
                d = decide(rule, "p", list(y[i, :target]), planned=target, max_branches=max_branches)
                if d.stopped_by:
                    break
            used[i], est[i] = d.branches, d.successes / d.resolved
            cover[i] = d.interval[0] <= q[i] <= d.interval[1]
        rows.append({"rule": rule.text, "branches": used.sum() / (n * max_branches), "coverage": cover.mean(),
                     "mae_true": np.abs(est - q).mean(), "mae_fixed": np.abs(fixed - q).mean(),
                     "mae_vs_fixed": np.abs(est - fixed).mean(), "stopped_early": float(np.mean(used < max_branches))})
    return rows


def matched_precision(h: float, n: int, kind: str = "uniform", seed: int = 1) -> dict:
    """The rule ``ci:h`` with maximum M_h against fixed M_h, where M_h is the smallest M whose interval is
    at most h wide (half-width) at every success count: the fixed design that guarantees the precision."""
    hw: dict[tuple[int, int], float] = {}

    def half(s: int, m: int) -> float:
        if (s, m) not in hw:
            lo, hi = confidence_sequence.__wrapped__(s, m)  # no LRU: many distinct (s, m) here
            hw[(s, m)] = (hi - lo) / 2
        return hw[(s, m)]

    m_h = 1
    while half(m_h // 2, m_h) > h:
        m_h += 1
    rule = StopRule(h)
    rounds = rule.rounds(m_h)
    rng = np.random.default_rng(seed)
    q = draw_q(kind, n, rng)
    used = np.empty(n)
    cover = np.empty(n, bool)
    for i in range(n):
        s = np.cumsum(rng.uniform(size=m_h) < q[i])
        for target in rounds:  # the rule of uqh.harness.sampling.branch_rules.decide (all branches resolve here)
            k = int(s[target - 1])
            if half(k, target) <= h or target == m_h:
                break
        lo, hi = confidence_sequence.__wrapped__(k, target)
        used[i], cover[i] = target, lo <= q[i] <= hi
    return {"h": h, "kind": kind, "m_h": m_h, "branches": used.mean() / m_h, "coverage": cover.mean()}


def per_look(name: str, h: float, n: int, max_branches: int, seed: int = 2) -> dict:
    """For comparison only: the same rounds with a fixed-n interval checked at every round, which ignores the
    optional stopping (Clopper-Pearson, Jeffreys equal-tailed with the 0/n and n/n ends at 0 and 1, Wald)."""
    from scipy.stats import beta

    def interval(k: int, m: int) -> tuple[float, float]:
        if name == "wald":
            p, half = k / m, 1.959964 * math.sqrt(k / m * (1 - k / m) / m)
            return max(0.0, p - half), min(1.0, p + half)
        if name == "clopper-pearson":
            lo = float(beta.ppf(0.025, k, m - k + 1)) if k > 0 else 0.0
            hi = float(beta.ppf(0.975, k + 1, m - k)) if k < m else 1.0
        else:  # jeffreys
            lo = float(beta.ppf(0.025, k + 0.5, m - k + 0.5)) if k > 0 else 0.0
            hi = float(beta.ppf(0.975, k + 0.5, m - k + 0.5)) if k < m else 1.0
        return lo, hi

    rng = np.random.default_rng(seed)
    q = rng.uniform(0.0, 1.0, n)
    rounds = StopRule(h).rounds(max_branches)
    used, cover = np.empty(n), np.empty(n, bool)
    for i in range(n):
        s = np.cumsum(rng.uniform(size=max_branches) < q[i])
        for target in rounds:
            lo, hi = interval(int(s[target - 1]), target)
            if (hi - lo) / 2 <= h or target == max_branches:
                break
        used[i], cover[i] = target, lo <= q[i] <= hi
    return {"interval": name, "h": h, "branches": used.mean() / max_branches, "coverage": cover.mean()}


def prior_density(kind: str, grid: np.ndarray) -> np.ndarray:
    """The q distributions of ``draw_q`` as probability weights on a grid."""
    if kind == "uniform":
        w = np.ones_like(grid)
    else:
        w = 0.678 * (grid <= 0.02) / 0.02 + 0.322 * ((grid >= 0.3) & (grid <= 1.0)) / 0.7
    return w / w.sum()


def _posterior_tables(kind: str, h: float, max_branches: int, grid_size: int) -> tuple[dict, dict]:
    """Per (n, successes) state: the share of the probability of q (given the outcomes, under the true q
    distribution) that the best interval of half-width h holds, and the chance that the next branch succeeds."""
    grid = (np.arange(grid_size) + 0.5) / grid_size  # cell midpoints: `window` cells span exactly 2h
    window = int(round(2 * h * grid_size))
    prior = prior_density(kind, grid)
    log_prior = np.log(np.maximum(prior, 1e-300))
    best, p_success = {}, {(0, 0): float((prior * grid).sum())}
    for n in range(1, max_branches + 1):
        for k in range(n + 1):
            log_w = log_prior + k * np.log(grid) + (n - k) * np.log1p(-grid)
            w = np.exp(log_w - log_w.max())
            w /= w.sum()
            cum = np.concatenate([[0.0], np.cumsum(w)])
            best[n, k] = float((cum[window:] - cum[:-window]).max())
            p_success[n, k] = float((w * grid).sum())
    return best, p_success


def _follow(stops: set, coverage_at: dict, p_success: dict, max_branches: int) -> tuple[float, float, float]:
    """(branches / M, coverage, share stopped before M) of the rule that stops at the states in ``stops`` (and at
    M), reporting an interval that covers with ``coverage_at[state]``: exact sums over outcome paths."""
    reach, branches, covered, early = {(0, 0): 1.0}, 0.0, 0.0, 0.0
    for n in range(1, max_branches + 1):
        grown: dict[tuple[int, int], float] = {}
        for (_, k), pr in reach.items():
            a = p_success[n - 1, k]
            grown[n, k + 1] = grown.get((n, k + 1), 0.0) + pr * a
            grown[n, k] = grown.get((n, k), 0.0) + pr * (1 - a)
        reach = {}
        for state, pr in grown.items():
            if n == max_branches or state in stops:
                branches, covered = branches + pr * n, covered + pr * coverage_at[state]
                early += pr if n < max_branches else 0.0
            else:
                reach[state] = pr
    return branches / max_branches, covered, early


def oracle_bayes(kind: str, h: float, max_branches: int, level: float = 0.95, grid_size: int = 20000) -> dict:
    """The fewest branches any rule can use when each early stop must report an interval of half-width <= h that
    holds ``level`` of the probability of q given the outcomes, with the true q distribution known (coverage
    averaged over prefixes: a weaker demand than coverage at every q). It looks after every branch and stops at
    the first outcome count where such an interval exists, so no rule of that kind stops earlier on any path.
    A prefix that reaches M reports its shortest interval holding ``level``."""
    best, p_success = _posterior_tables(kind, h, max_branches, grid_size)
    stops = {s for s, share in best.items() if share >= level and s[0] < max_branches}
    coverage_at = {s: share if share >= level else level for s, share in best.items()}
    branches, coverage, early = _follow(stops, coverage_at, p_success, max_branches)
    return {"kind": kind, "h": h, "level": level, "branches": branches, "coverage": coverage,
            "stopped_early": early}


def coverage_floor(kind: str, h: float, max_branches: int, target: float, grid_size: int = 20000) -> dict:
    """The fewest branches any rule can use at an averaged coverage of ``target``, with the true q distribution
    known and nothing asked of single intervals: an early stop needs an interval of half-width <= h (holding any
    share of the probability of q), and a prefix that reaches M may report [0, 1]. Minimises E[branches] +
    lam * P(miss) by backward induction over the (n, successes) states, which carry everything the decision
    needs, and mixes the two policies whose lam bracket the target (a randomised rule: the exact floor)."""
    best, p_success = _posterior_tables(kind, h, max_branches, grid_size)
    coverage_at = {s: share if s[0] < max_branches else 1.0 for s, share in best.items()}

    def policy(lam: float) -> tuple[float, float]:
        value = {(max_branches, k): float(max_branches) for k in range(max_branches + 1)}
        stops = set()
        for n in range(max_branches - 1, 0, -1):
            for k in range(n + 1):
                a = p_success[n, k]
                go_on = a * value[n + 1, k + 1] + (1 - a) * value[n + 1, k]
                stop_now = n + lam * (1 - best[n, k])
                value[n, k] = min(stop_now, go_on)
                if stop_now < go_on:
                    stops.add((n, k))
        return _follow(stops, coverage_at, p_success, max_branches)[:2]

    lo, hi = 0.0, 1e6  # lam: 0 stops every prefix at once; 1e6 stops none early
    low, high = policy(lo), policy(hi)
    if low[1] >= target:
        return {"kind": kind, "h": h, "target": target, "branches": low[0], "coverage": low[1]}
    for _ in range(60):
        mid = (lo + hi) / 2
        got = policy(mid)
        lo, low, hi, high = (lo, low, mid, got) if got[1] >= target else (mid, got, hi, high)
    share = (target - low[1]) / (high[1] - low[1]) if high[1] > low[1] else 1.0
    return {"kind": kind, "h": h, "target": target, "branches": low[0] + share * (high[0] - low[0]),
            "coverage": target}


# ------------------------------------------------------------------------------------------ report


def lower_bound_half_width(n: int, alpha: float = 0.05) -> float:
    """Half of the smallest upper end any interval with coverage >= 1 - alpha at every q can give after n failures:
    at q = u the chance of n failures is (1-u)^n, so u >= 1 - alpha^(1/n)."""
    return (1.0 - alpha ** (1.0 / n)) / 2


def render(e2e: dict, sims: dict[str, list[dict]], matched: list[dict], naive: list[dict], floors: list[dict],
           args, wall: float) -> str:
    m = e2e["max_branches"]
    fixed = e2e["runs"][0]
    lines = [
        "# Monte Carlo q_Z at fewer calls: sequential stopping against fixed M",
        "",
        f"`benchmarks/qz_cost.py --prefixes {args.prefixes} --branches {m} --half-widths {args.half_widths} "
        f"--sim-prefixes {args.sim_prefixes}` on {platform.machine()} / Python {platform.python_version()}, "
        f"wall time {wall:.0f} s. Rule `ci:H`: rounds of {StopRule(0.2).rounds(m)} branches per prefix; a prefix "
        "stops once its 95% beta-binomial confidence sequence (Jeffreys mixture, valid at any stopping time) has "
        "half-width <= H, else at M.",
        "",
        f"## End to end: `uqh continue`, fake server, {e2e['prefixes']} prefixes with q = (i + 0.5) / "
        f"{e2e['prefixes']}",
        "",
        "| rule | model calls | vs fixed M | prefixes stopped early | coverage of true q | mean half-width | "
        "MAE vs true q | MAE vs fixed-M q_hat | prompt tokens from cache |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in e2e["runs"]:
        lines.append(
            f"| {r['rule'] if r['rule'] != 'fixed' else f'fixed M = {m}'} | {r['calls']:,} | "
            f"{100 * r['calls'] / fixed['calls']:.0f}% | {r['stopped_early']} | {100 * r['coverage']:.1f}% | "
            f"{r['mean_half_width']:.3f} | {r['mae_true']:.4f} | {r['mae_vs_fixed']:.4f} | "
            f"{100 * r['cached_prompt_tokens'] / max(r['prompt_tokens'], 1):.0f}% |"
        )
    lines += [
        "",
        "Every sequential run's branches are the fixed run's branches 0..n-1 (same episode ids, seeds and outcomes; "
        "checked). The fixed row's coverage is of the same confidence sequence at n = M (the fixed design records "
        "no interval). Prompt-cache share: the fake server caches message prefixes like OpenAI; the sequential "
        "rules' first round of one branch per prefix writes each prefix before its other branches are sent, so "
        f"{100 * e2e['runs'][-1]['first_calls_fully_cached']:.0f}% of their branch calls read their whole prompt "
        f"from the cache, against {100 * fixed['first_calls_fully_cached']:.0f}% when all M branches of a prefix "
        "are sent at once (fixed).",
        "",
        f"## Simulation: the same decision function, {args.sim_prefixes:,} prefixes per distribution, M = {m}",
        "",
    ]
    for kind, rows in sims.items():
        title = ("q ~ U[0, 1]" if kind == "uniform" else
                 "Table 7 shape: 67.8% stuck (q ~ U[0, 0.02]), the rest q ~ U[0.3, 1]")
        lines += [f"**{title}**", "",
                  "| rule | branches vs fixed M | stopped early | coverage | MAE vs true q | MAE vs fixed-M q_hat |",
                  "|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['rule']} | {100 * r['branches']:.1f}% | {100 * r['stopped_early']:.1f}% | "
                         f"{100 * r['coverage']:.2f}% | {r['mae_true']:.4f} | {r['mae_vs_fixed']:.4f} |")
        lines.append("")
    lines += [
        "## Against the fixed design of the same guaranteed precision",
        "",
        "| q | H | fixed M that guarantees half-width <= H | ci:H (maximum that M) branches vs fixed | coverage |",
        "|---|---|---|---|---|",
    ]
    for r in matched:
        lines.append(f"| {'U[0, 1]' if r['kind'] == 'uniform' else 'Table 7 shape'} | {r['h']:g} | {r['m_h']} | "
                     f"{100 * r['branches']:.1f}% | {100 * r['coverage']:.2f}% |")
    lines += [
        "",
        f"## For comparison: fixed-n intervals checked at every round (not valid under optional stopping), "
        f"q ~ U[0, 1], M = {m}",
        "",
        "| interval | H | branches vs fixed M | coverage |",
        "|---|---|---|---|",
    ]
    for r in naive:
        lines.append(f"| {r['interval']} | {r['h']:g} | {100 * r['branches']:.1f}% | {100 * r['coverage']:.2f}% |")
    lines += [
        "",
        f"## The floor for any rule at H = 0.1: oracles that know the distribution of q, M = {m}",
        "",
        "Exact sums over outcome paths, no sampling. *Each early interval 95%*: stops a prefix at the first branch "
        "count where an interval of half-width <= H holds 95% of the probability of q given the outcomes (under "
        "the true q distribution), looking after every branch; no rule whose early intervals hold 95% stops "
        "earlier on any path. *Averaged coverage*: the weakest reading -- only the coverage averaged over prefixes "
        "must reach the target; early intervals may hold less if others hold more, and a prefix that reaches M "
        "may report [0, 1]. The fewest branches such a rule can use, by backward induction over "
        "(branches, successes) with a price on a miss, mixing the two policies that bracket the target.",
        "",
        "| q | demand | branches vs fixed M | stopped early | coverage (averaged over prefixes) |",
        "|---|---|---|---|---|",
    ]
    for r in floors:
        demand = (f"each early interval {100 * r['level']:.0f}%" if "level" in r
                  else f"averaged coverage {100 * r['target']:.0f}%")
        early = f"{100 * r['stopped_early']:.1f}%" if "stopped_early" in r else "--"
        lines.append(f"| {'U[0, 1]' if r['kind'] == 'uniform' else 'Table 7 shape'} | {demand} | "
                     f"{100 * r['branches']:.1f}% | {early} | {100 * r['coverage']:.2f}% |")
    lb = lower_bound_half_width(m)
    best = {r["kind"]: (r["m_h"], r["branches"]) for r in matched if r["h"] == 0.1}
    per_interval = {r["kind"]: r["branches"] for r in floors if r.get("level") == 0.95}
    averaged = {r["kind"]: r["branches"] for r in floors if r.get("target") == 0.93}
    lines += [
        "",
        "## Reading",
        "",
        f"- **Target not met, and not reachable with M = {m}.** After n outcomes that all agree, any interval with "
        f"95% coverage at every q has an upper end of at least 1 - 0.05^(1/n) (the chance of n failures at q = u "
        f"is (1-u)^n): half-width >= {lb:.3f} at n = {m}, more for mixed outcomes. So no valid rule can stop a "
        f"prefix at H = 0.1 before {m} branches -- `ci:0.1` runs exactly the fixed design (100% of the calls, "
        "identical q_hat). Even intervals that ignore optional stopping (Clopper-Pearson, Jeffreys, checked at each "
        "round) do not reach 0.1 within 10 draws; the Wald interval does, with zero width after 0/n or n/n, and "
        "covers almost nothing (the table of fixed-n intervals).",
        "- **Not even an oracle reaches it on uniform q.** A rule that knows the true distribution of q needs "
        f"{100 * per_interval['uniform']:.0f}% of the branches of fixed M = {m} when each early interval must be "
        "a 95% interval, and still "
        f"{100 * averaged['uniform']:.0f}% when only the coverage averaged over prefixes must reach 93% (the "
        "weakest reading of the issue's two demands). On the Table 7 shape the per-interval oracle needs "
        f"{100 * per_interval['table7']:.0f}%; only the averaged-coverage oracle gets under half "
        f"({100 * averaged['table7']:.0f}%), by knowing that two thirds of the prefixes are stuck and giving "
        "them intervals that hold less than 95% each. A rule that learned the q distribution from the run's own "
        "prefixes (empirical Bayes) could at best approach that, with coverage that holds only on average over "
        "prefixes; uqh does not ship one.",
        "- What the rule buys at this M: wider targets stop the prefixes whose outcomes agree -- most of the Table "
        "7-shaped population, fewer of the uniform one -- at a measured cost in MAE vs fixed M (the rows above). "
        "Coverage stays above the nominal 95% in every ci:H row: the interval is anytime-valid, and conservative.",
        "- Where sequential stopping pays is precision: to guarantee a half-width H for every prefix, a fixed "
        "design must plan for q = 0.5; the rule spends that only on prefixes near 0.5. At H = 0.1 (fixed M = "
        f"{best['uniform'][0]}) `ci:0.1` runs {100 * best['uniform'][1]:.0f}% of that design's branches for uniform "
        f"q and {100 * best['table7'][1]:.0f}% for the Table 7 shape, coverage >= "
        f"{100 * min(r['coverage'] for r in matched):.1f}%.",
        "- Prompt caching is independent of the rule: branch requests share a byte-identical prefix; API providers "
        "with automatic caching (OpenAI, DeepSeek, OpenRouter routes) serve it from cache, Claude models get "
        "`cache_control` marks through litellm, and cached tokens are priced at litellm's cached rate.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefixes", type=int, default=200)
    p.add_argument("--branches", type=int, default=10)
    p.add_argument("--half-widths", default="0.1,0.2,0.3,0.4")
    p.add_argument("--sim-prefixes", type=int, default=20000)
    p.add_argument("--matched-prefixes", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "qz_cost.md")
    args = p.parse_args(argv)
    half_widths = [float(x) for x in args.half_widths.split(",")]
    t0 = time.perf_counter()
    print("end to end ...", file=sys.stderr, flush=True)
    e2e = end_to_end(args.prefixes, args.branches, half_widths, args.concurrency)
    print("simulation ...", file=sys.stderr, flush=True)
    sims = {kind: simulate(kind, args.sim_prefixes, args.branches, half_widths) for kind in ("uniform", "table7")}
    matched = [matched_precision(h, args.matched_prefixes, kind) for kind in ("uniform", "table7") for h in (0.2, 0.1)]
    naive = [per_look(name, h, args.sim_prefixes // 4, args.branches)
             for name in ("clopper-pearson", "jeffreys", "wald") for h in (0.1, 0.2)]
    floors = [row for kind in ("uniform", "table7") for row in (
        oracle_bayes(kind, 0.1, args.branches, 0.95),
        *(coverage_floor(kind, 0.1, args.branches, target) for target in (0.93, 0.95)))]
    text = render(e2e, sims, matched, naive, floors, args, time.perf_counter() - t0)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(
        {"end_to_end": e2e, "simulation": sims, "matched": matched, "per_look": naive, "floors": floors},
        indent=1, default=float) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

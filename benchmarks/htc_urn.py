"""Does the learned trajectory calibrator (HTC) approach the truth as it sees more training episodes? (issue 41)

    .venv/bin/python benchmarks/htc_urn.py [--test-episodes 4000] [--sizes 25,50,100,200,400,800,1600]
        [--seeds 3] [--out benchmarks/results/htc_urn.md]

Episodes follow the ``urn`` domain's generative process (``benchmarks/oracle_streams.simulate``: the Pólya urn ball
by ball, a policy that stops after a white ball with probability 1/2; step t's truthful forecast q_t is the oracle's
``success_probability``). They are written as uqh records (``Episode`` / ``Step`` with ``info["q_t"]``, the
observation "red"/"white") whose verbal confidence is a miscalibrated, noisy q_t: σ(2 logit q_t + ε), ε ~ N(0, 0.5²)
-- over-confident, as agents are. No token logprobs: HTC uses the features the records carry (verbal dynamics,
structure, position; the logprob features are dropped and named).

For each training size n and seed, HTC is fitted on n training episodes (``ScoreOptions.calibrator_from``: the
transfer path of ``uqh score --calibrator-from``) and applied to one fixed test set of episodes; the pipeline's own
``tps_gap`` metric (TPS(q) − TPS(F) on the same trajectories, :mod:`uqh.scoring.truth`) is read for the log and
Brier families, with the raw verbal stream and its cross-fitted Platt map on the test set as references. Reported:
the mean gap over seeds per n. Numbers are measured and written, never asserted.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from oracle_streams import simulate  # noqa: E402
from uqh.rundir.schema import Attempt, CallRecord, Episode, Manifest, RunConfig, Step, StopReason  # noqa: E402
from uqh.scoring.pipeline import ScoreOptions, score_run  # noqa: E402
from uqh.scoring.rules import parse_score  # noqa: E402
from uqh.scoring.streams import run_data_from_records  # noqa: E402
from uqh.scoring.truth import Q_T_KEY  # noqa: E402

SCORES = ("log", "brier")


def records(n: int, rng: np.random.Generator, prefix: str) -> list[Episode]:
    """n urn episodes as uqh records, verbal confidence σ(2 logit q_t + ε)."""
    q, offsets, y, t = simulate(n, rng)
    logit = np.log(np.clip(q, 1e-6, 1 - 1e-6)) - np.log1p(-np.clip(q, 1e-6, 1 - 1e-6))
    verbal = 1 / (1 + np.exp(-(2 * logit + rng.normal(0, 0.5, q.size))))
    episodes = []
    for i in range(n):
        a, b = int(offsets[i]), int(offsets[i + 1])
        steps = [Step(t=k + 1, think="draw", action="Draw[]", verbal_confidence=float(verbal[a + k]),
                      explanation="", observation="red" if rng.random() < 0.5 else "white",
                      attempts=[Attempt(attempt=0, raw_text="", call=CallRecord(model="sim"))],
                      info={Q_T_KEY: float(q[a + k])}) for k in range(b - a)]
        episodes.append(Episode(episode_id=f"{prefix}{i:05d}#0", task_id=f"{prefix}{i:05d}", stop_reason=StopReason.clean,
                                outcome=int(y[i]), n_steps=len(steps), step_budget=5, task_prompt="Draw balls.",
                                steps=steps))
    return episodes


def as_run(label: str, episodes: list[Episode]):
    """The records as scoring's RunData (with a manifest, as a run directory of the urn domain would have)."""
    cfg = RunConfig(domain="urn", task_ids=sorted({e.task_id for e in episodes}), model="simulated", step_budget=5,
                    prompt_sha256="0" * 64, package_version="0")
    manifest = Manifest(config=cfg, config_hash=cfg.config_hash(), created_at="2026-01-01T00:00:00Z", system_prompt="")
    return run_data_from_records(Path(label), manifest, episodes, [])


def gaps(res, predictor: str, calibration: str) -> dict[str, float]:
    row = res.row(predictor, calibration)
    return {s: row.value("tps_gap", s) for s in SCORES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--test-episodes", type=int, default=4000)
    ap.add_argument("--sizes", default="25,50,100,200,400,800,1600")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/htc_urn.md")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    scores = tuple(parse_score(s) for s in SCORES)
    test = as_run("test", records(args.test_episodes, np.random.default_rng(10_000), "x"))
    start = time.perf_counter()
    ref = score_run(test, ScoreOptions(predictors=("verbal",), scores=scores, n_bootstrap=0, auq=False))
    table = {}
    for n in sizes:
        per_seed = []
        for seed in range(args.seeds):
            train = as_run(f"train-{n}-{seed}", records(n, np.random.default_rng(seed), "r"))
            res = score_run(test, ScoreOptions(predictors=("htc",), scores=scores, n_bootstrap=0, auq=False,
                                               calibrator_from=train))
            per_seed.append(gaps(res, "htc", "raw"))
        table[n] = {s: float(np.mean([g[s] for g in per_seed])) for s in SCORES}
        print(n, table[n], flush=True)
    seconds = time.perf_counter() - start
    lines = [
        "# HTC on the urn domain: TPS gap to the truth vs training episodes",
        "",
        f"`.venv/bin/python benchmarks/htc_urn.py --test-episodes {args.test_episodes} --sizes {args.sizes} "
        f"--seeds {args.seeds}` ({platform.python_version()}, {seconds:.0f} s). Test set: {args.test_episodes} urn "
        f"episodes; verbal confidence σ(2 logit q_t + ε), ε ~ N(0, 0.5²). TPS gap = TPS(q) − TPS(F) on the test "
        "trajectories (linear-front weights; lower is better, 0 = the truth); HTC fitted on n training episodes "
        f"(ridge, λ = 1), mean over {args.seeds} seeds.",
        "",
        "| forecast | training episodes | TPS gap log | TPS gap Brier |",
        "|---|---|---|---|",
        f"| verbal (raw) | – | {gaps(ref, 'verbal', 'raw')['log']:.4f} | {gaps(ref, 'verbal', 'raw')['brier']:.4f} |",
        f"| verbal (Platt, cross-fitted on the test set) | – | {gaps(ref, 'verbal', 'platt')['log']:.4f} | "
        f"{gaps(ref, 'verbal', 'platt')['brier']:.4f} |",
    ]
    lines += [f"| HTC | {n} | {g['log']:.4f} | {g['brier']:.4f} |" for n, g in table.items()]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

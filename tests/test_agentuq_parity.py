"""Differential test against agentuq's own code (deeplearning-wisc/agentuq @ 364d9a0, the tau2-bench fork of
arXiv:2602.05073): its per-role aggregation (``src/tau2/utils/uq_logprobs.py``: ``build_token_logprob_rows``,
``_update_accumulator``, ``get_trajectory_uq_summary``) and its evaluation (``src/tau2/scripts/
evaluate_uq_estimates.py``: AUROC, AUARC, Pearson, Spearman, Kendall tau-b) were run on the token records of
``tests/data/agentuq_parity.json`` (a hand-made set, and the accepted sidecar rows of a finished local SmolLM2
arithmetic run -- two of its three episodes hit the step budget and have no reward, so the evaluation metrics are
checked on the hand-made set); the file holds those inputs and agentuq's outputs as numbers (token texts shortened:
no formula reads them). uqh must reproduce them to 1e-9.

Deliberate differences, each tested here:
- agentuq's failure label is reward < threshold with a command-line default of 0.0 (no 0/1 reward is a failure);
  uqh applies the rule with threshold 1.0 to its outcome Y (failure iff Y = 0), and agentuq was run with 1.0.
- a token without top-k alternatives: agentuq counts it in ``mean_topk_entropy`` with entropy 0, uqh reports the
  mean as missing.
- tied uncertainties: agentuq's AUARC depends on the input order (stable sort); uqh's is the mean over orders.

``uqh score --agentuq-conventions`` takes agentuq's side of each difference (and counts rejected calls and the final
user reply, as agentuq's accumulator does); the tests at the end check it on the committed outputs where they cover
the case (missing top-k, tied AUARC) and on hand-derived values where they do not (rejected calls, final reply).
"""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from uqh.rundir.schema import TokenLogprob
from uqh.scoring import failure_association as fa
from uqh.scoring.diagnostics import auarc, auroc, kendall_failure, pearson_failure, spearman_failure
from uqh.scoring.token_signals import role_summary

DATA = json.loads((Path(__file__).parent / "data" / "agentuq_parity.json").read_text())
SETS = [k for k in ("hand", "local_run") if k in DATA]
METRICS = {  # agentuq's key -> uqh's function of (C, Y)
    "auroc_failure_vs_uncertainty": lambda c, y: auroc(c, y),
    "auarc": auarc,
    "pearson_uncertainty_negative_reward": pearson_failure,
    "spearman_uncertainty_negative_reward": spearman_failure,
    "kendall_uncertainty_negative_reward": kendall_failure,
}
RANK_METRICS = [k for k in METRICS if not k.startswith("pearson")]


def calls(traj, role):
    return [[TokenLogprob.model_validate(t) for t in call] for call in traj.get(role, [])]


def has_all_topk(traj, roles):
    return all(t["top_logprobs"] for r in roles for call in traj.get(r, []) for t in call)


def test_the_data_covers_both_sets_and_the_cases():
    assert DATA["agentuq_commit"].startswith("364d9a0") and DATA["failure_threshold"] == fa.FAILURE_THRESHOLD
    assert SETS == ["hand", "local_run"]
    local = DATA["local_run"]["trajectories"]
    assert len(local) == 3 and sum(len(t) for traj in local for t in traj["assistant"]) > 1000  # real tokens
    assert not has_all_topk(DATA["hand"]["trajectories"][2], ["assistant"])  # the missing-top-k case is there


@pytest.mark.parametrize("which", SETS)
def test_per_role_summaries_equal_agentuq(which):
    checked = 0
    for traj in DATA[which]["trajectories"]:
        theirs = DATA[which]["summaries"][traj["id"]]
        roles = {"assistant": ["assistant"], "user": ["user"], "combined": ["assistant", "user"]}
        for role, parts in roles.items():
            if role not in theirs:
                continue
            ours = role_summary([c for r in parts for c in calls(traj, r)])
            ref = theirs[role]
            assert ours.total_tokens == ref["total_tokens"]
            for field in ("trajectory_nll", "avg_token_nll"):
                assert getattr(ours, field) == pytest.approx(ref[field], abs=1e-9), (traj["id"], role, field)
            assert ours.min_chosen_prob == pytest.approx(ref["min_chosen_prob"], rel=1e-9)  # can be ~1e-10
            if has_all_topk(traj, parts):
                assert ours.mean_topk_entropy == pytest.approx(ref["mean_topk_entropy"], abs=1e-9)
            else:  # deliberate: missing, where agentuq counts the token with entropy 0
                assert math.isnan(ours.mean_topk_entropy) and ref["mean_topk_entropy"] is not None
            checked += 1
    assert checked >= 3


@pytest.mark.parametrize("which", [k for k in SETS if "metrics_uncertainty_one_minus_c" in DATA[k]])
def test_evaluation_metrics_equal_agentuq(which):
    d = DATA[which]
    c = np.array(d["confidence"])
    y = (np.array(d["rewards"]) >= fa.FAILURE_THRESHOLD).astype(float)
    assert np.unique(np.round(c, 12)).size == c.size  # untied: AUARC does not depend on input order
    for key, ours in METRICS.items():
        theirs = d["metrics_uncertainty_one_minus_c"][key]
        if theirs is None:
            assert math.isnan(ours(c, y)), key
        else:
            assert ours(c, y) == pytest.approx(theirs, abs=1e-9), key
    # agentuq's own uncertainty (avg token NLL) orders trajectories as 1 - exp(-avg NLL): same rank metrics
    for key in RANK_METRICS:
        theirs = d["metrics_uncertainty_avg_token_nll"][key]
        if theirs is not None:
            assert METRICS[key](c, y) == pytest.approx(theirs, abs=1e-9), key


def test_combined_role_metrics_equal_agentuq():
    d = DATA["hand"]
    summaries = [role_summary(calls(t, "assistant") + calls(t, "user")) for t in d["trajectories"]]
    c = np.exp(-np.array([s.avg_token_nll for s in summaries]))
    y = np.array(d["rewards"])
    for key, ours in METRICS.items():
        assert ours(c, y) == pytest.approx(d["metrics_combined_one_minus_c"][key], abs=1e-9), key


def test_ties_agentuq_depends_on_order_uqh_takes_the_mean_over_orders():
    t = DATA["ties"]
    c = 1.0 - np.array(t["uncertainty"])
    y = np.array(t["rewards"])
    assert t["metrics"]["auarc"] != pytest.approx(t["auarc_reversed_order"])  # agentuq: order-dependent
    assert auarc(c, y) == pytest.approx(t["auarc_mean_over_input_orders"], abs=1e-9)
    for key in ("auroc_failure_vs_uncertainty", "pearson_uncertainty_negative_reward",
                "spearman_uncertainty_negative_reward", "kendall_uncertainty_negative_reward"):
        assert METRICS[key](c, y) == pytest.approx(t["metrics"][key], abs=1e-9), key


def test_bootstrap_counts_equal_the_expanded_sample():
    """A (B, n) count row gives what agentuq's formulas give on the sample with each trajectory repeated."""
    rng = np.random.default_rng(3)
    c = rng.uniform(size=12)
    y = (rng.uniform(size=12) < 0.5).astype(float)
    y[:2] = [0, 1]
    counts = rng.multinomial(12, np.ones(12) / 12, size=4).astype(float)
    for f in (auarc, pearson_failure, spearman_failure, kendall_failure):
        batch = f(c, y, counts)
        for b in range(4):
            idx = np.repeat(np.arange(12), counts[b].astype(int))
            assert batch[b] == pytest.approx(f(c[idx], y[idx]), abs=1e-12, nan_ok=True), f.__name__


def test_undefined_is_nan():
    c = np.array([0.2, 0.4, 0.6])
    for f in (pearson_failure, spearman_failure, kendall_failure):
        assert math.isnan(f(c, np.ones(3)))  # no failure: no variance in Y
        assert math.isnan(f(np.full(3, 0.5), np.array([0.0, 1.0, 1.0])))  # constant C
    assert math.isnan(auarc(np.zeros(0), np.zeros(0)))


def test_uqh_score_and_export_show_the_agentuq_metrics(tmp_path, capsys):
    import csv
    import io

    from uqh.cli import main
    from scoring_fixtures import make_episode, make_row, make_tokens, write_run_dir

    probs = [0.9, 0.3, 0.8, 0.4, 0.7, 0.6]
    eps = [make_episode(f"t{i}#0", "clean", [0.5], outcome=int(p > 0.5 if i != 2 else 0)) for i, p in enumerate(probs)]
    rows = [make_row(f"t{i}#0", 1, make_tokens([(p, [p, 1 - p])])) for i, p in enumerate(probs)]
    run = write_run_dir(tmp_path / "run", eps, rows)
    args = ["score", str(run), "--bootstrap", "0", "--predictor", "token_gmean_prob", "--calibration", "none"]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "AUARC↑" in table and "Kendall τ-b↑" in table and "Φ_min" in table
    assert main(args + ["--format", "json"]) == 0
    res = json.loads(capsys.readouterr().out)
    got = {m["metric"]: m["estimate"]["value"] for m in res["rows"][0]["metrics"]}
    c, y = np.array(probs), np.array([e.outcome for e in eps], dtype=float)
    assert got["auarc"] == pytest.approx(auarc(c, y))
    assert got["kendall_failure"] == pytest.approx(kendall_failure(c, y))
    assert {a["aggregator"] for a in res["auq"]} == {"last", "avg", "min"}
    assert all("spearman_failure" in {m["metric"] for m in a["metrics"]} for a in res["auq"])
    assert main(args + ["--format", "csv"]) == 0
    assert {"auarc", "pearson_failure", "spearman_failure", "kendall_failure"} <= {
        r["metric"] for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert main(["export", str(run), "--to", str(tmp_path / "exp"), "--format", "csv", "--bootstrap", "0"]) == 0
    assert "kendall_failure" in (tmp_path / "exp" / "scores.csv").read_text()


@pytest.mark.parametrize("which", SETS)
def test_running_predictors_end_at_agentuqs_trajectory_summary(which):
    """Φ_last of the running predictors over a trajectory's steps (one accepted call per step) is agentuq's
    trajectory-level summary of the assistant role, mapped to a confidence."""
    from scoring_fixtures import make_episode, make_row
    from uqh.scoring.diagnostics import phi_last
    from uqh.scoring.streams import run_data_from_records

    eps, rows = [], []
    for traj in DATA[which]["trajectories"]:
        steps = calls(traj, "assistant")
        eps.append(make_episode(traj["id"], "clean", [0.5] * len(steps), outcome=1))
        rows += [make_row(traj["id"], t + 1, toks) for t, toks in enumerate(steps)]
    run = run_data_from_records(Path("."), None, eps, rows)
    by_id = {e: i for i, e in enumerate(run.episode_ids)}
    for traj in DATA[which]["trajectories"]:
        ref = DATA[which]["summaries"][traj["id"]]["assistant"]
        i = by_id[traj["id"]]
        last = {name: phi_last(run.streams[name], run.offsets)[i] for name in ("token_traj_prob", "token_traj_gmean_prob")}
        assert last["token_traj_gmean_prob"] == pytest.approx(math.exp(-ref["avg_token_nll"]), rel=1e-9)
        assert last["token_traj_prob"] == pytest.approx(math.exp(-ref["trajectory_nll"]), rel=1e-9, abs=1e-300)


# ------------------------------------------------------------------ uqh score --agentuq-conventions


def agentuq_run(traj, *, rejected=(), final_reply=None, agentuq=True):
    """One episode from a hand-made trajectory: one accepted call per step, the user's calls as the opening turn,
    ``rejected``: (t, tokens) rows of rejected calls, ``final_reply``: the user's reply to the last action."""
    from uqh.rundir.schema import LogprobRow
    from uqh.scoring.streams import run_data_from_records
    from scoring_fixtures import make_episode

    steps = calls(traj, "assistant")
    ep = make_episode("a#0", "clean", [0.5] * len(steps), outcome=1)
    rows = [LogprobRow(episode_id="a#0", t=t, attempt=1, accepted=True, tokens=c) for t, c in enumerate(steps, 1)]
    other = [LogprobRow(episode_id="a#0", t=t, attempt=0, accepted=False, tokens=c) for t, c in rejected]
    user = [LogprobRow(episode_id="a#0", t=0, attempt=i, accepted=True, tokens=c)
            for i, c in enumerate(calls(traj, "user"))]
    if final_reply is not None:
        user.append(LogprobRow(episode_id="a#0", t=len(steps), attempt=0, accepted=True, tokens=final_reply))
    return run_data_from_records(Path("."), None, [ep], rows, user_rows=user, other_rows=other if agentuq else None)


@pytest.mark.parametrize("traj", [t for t in DATA["hand"]["trajectories"] if "user" in DATA["hand"]["summaries"][t["id"]]],
                         ids=lambda t: t["id"])
def test_agentuq_conventions_reproduce_its_mean_topk_entropy_missing_top_k_included(traj):
    """Under agentuq's conventions the per-role entropy stream at the last step is exp(−agentuq's
    ``mean_topk_entropy``) for every role -- the trajectory whose token has no top-k included (agentuq counts it with
    entropy 0; uqh's own convention makes it missing) -- committed outputs of agentuq's code."""
    ours = agentuq_run(traj)
    for role in ("assistant", "user", "combined"):
        ref = DATA["hand"]["summaries"][traj["id"]][role]["mean_topk_entropy"]
        assert ours.streams[f"{role}_entropy"][-1] == pytest.approx(math.exp(-ref), rel=1e-9), role
    if traj["id"] == "missing_topk":
        assert math.isnan(agentuq_run(traj, agentuq=False).streams["assistant_entropy"][-1])


def test_agentuq_conventions_count_every_call_and_the_final_reply():
    """agentuq's accumulator (``_update_accumulator``) adds the tokens of every model response it saves -- a rejected
    call's too -- and of every user message, the last one included. Expected values derived by hand from that
    formula on a tiny case (agentuq's code cannot run here): accepted call 0.5, rejected call 0.25, final user reply
    0.8 -> assistant trajectory NLL ln 2 + ln 4, user NLL adds −ln 0.8."""
    from scoring_fixtures import make_tokens

    traj = {"assistant": [[t.model_dump() for t in make_tokens([(0.5, [0.5, 0.5])])]], "user": []}
    rejected = [(1, make_tokens([(0.25, [0.25, 0.75])]))]
    final = make_tokens([(0.8, [0.8, 0.2])])
    theirs = agentuq_run(traj, rejected=rejected, final_reply=final)
    assert theirs.streams["assistant_traj_prob"][-1] == pytest.approx(0.5 * 0.25, rel=1e-12)
    assert theirs.streams["assistant_tokens"][-1] == pytest.approx(1 / (1 + 2 / 1000))
    assert theirs.streams["user_traj_prob"][-1] == pytest.approx(0.8, rel=1e-12)
    assert theirs.streams["combined_min_prob"][-1] == pytest.approx(0.25, rel=1e-12)
    ours = agentuq_run(traj, rejected=rejected, final_reply=final, agentuq=False)
    assert ours.streams["assistant_traj_prob"][-1] == pytest.approx(0.5)  # the accepted call only
    assert math.isnan(ours.streams["user_traj_prob"][-1])  # the final reply enters no step: no user token yet


def test_agentuq_conventions_take_auarc_ties_in_input_order(tmp_path, capsys):
    """agentuq's committed AUARC on tied uncertainties (its stable sort: input order) and on the reversed input,
    through `uqh score --agentuq-conventions` on a run whose episodes are in that order."""
    from scoring_fixtures import make_episode, write_run_dir

    t = DATA["ties"]
    c = 1.0 - np.array(t["uncertainty"])
    y = np.array(t["rewards"])
    assert auarc(c, y, ties="input") == pytest.approx(t["metrics"]["auarc"], abs=1e-9)
    assert auarc(c[::-1], y[::-1], ties="input") == pytest.approx(t["auarc_reversed_order"], abs=1e-9)
    eps = [make_episode(f"t{i}#0", "clean", [float(ci)], outcome=int(yi)) for i, (ci, yi) in enumerate(zip(c, y))]
    run = write_run_dir(tmp_path / "run", eps)
    values = {}
    for flag in ([], ["--agentuq-conventions"]):
        assert main_score([str(run), "--predictor", "verbal", "--calibration", "none", "--bootstrap", "0",
                           "--format", "json", *flag]) == 0
        res = json.loads(capsys.readouterr().out)
        values[bool(flag)] = {m["metric"]: m["estimate"]["value"] for m in res["rows"][0]["metrics"]}
        assert res["settings"]["agentuq_conventions"] is bool(flag)
    assert values[True]["auarc"] == pytest.approx(t["metrics"]["auarc"], abs=1e-9)
    assert values[False]["auarc"] == pytest.approx(t["auarc_mean_over_input_orders"], abs=1e-9)
    for key in ("auroc", "spearman_failure", "kendall_failure"):  # the rank metrics do not depend on the convention
        assert values[True][key] == pytest.approx(values[False][key], abs=1e-12)


def main_score(argv):
    from uqh.cli import main

    return main(["score", *argv])

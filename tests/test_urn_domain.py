"""The oracle domain `urn`: q_t in closed form against enumeration, scipy's beta-binomial, a 100,000-episode Monte
Carlo check under a history-dependent stopping policy, and the environment recording q_t per step."""
import asyncio
import itertools
from fractions import Fraction

import numpy as np
import pytest

from uqh.domains.base import InvalidAction
from uqh.domains.domain_registry import get_domain_class
from uqh.domains.urn import (
    Q_T_KEY, UrnEnv, hidden_draws, success_probability, success_probability_exact, task_parameters,
)


def enumerated_q(a: int, b: int, n_draws: int, target: int, red: int, white: int) -> Fraction:
    """q by brute force: every continuation of the urn, its probability as the product of the draw-by-draw
    Pólya probabilities (no beta-binomial formula)."""
    m = n_draws - red - white
    total = Fraction(0)
    for seq in itertools.product((True, False), repeat=m):
        p, r, w = Fraction(1), a + red, b + white
        for is_red in seq:
            p *= Fraction(r if is_red else w, r + w)
            r, w = r + is_red, w + (not is_red)
        if red + sum(seq) >= target:
            total += p
    return total


def test_a_hand_computed_case():
    # 1 red, 1 white, two draws, both must be red: 1/2 * 2/3
    assert success_probability_exact(1, 1, 2, 2, 0, 0) == Fraction(1, 3)
    # one red seen: the next must be red, 2/3
    assert success_probability_exact(1, 1, 2, 2, 1, 0) == Fraction(2, 3)
    assert success_probability_exact(1, 1, 2, 2, 0, 1) == 0
    assert success_probability_exact(1, 1, 2, 1, 1, 0) == 1


@pytest.mark.parametrize("a,b", [(1, 1), (1, 3), (2, 1), (3, 3)])
def test_closed_form_equals_enumeration_on_every_small_history(a, b):
    checked = 0
    for n_draws in range(1, 6):
        for target in range(1, n_draws + 1):
            for seen in range(n_draws + 1):
                for red in range(seen + 1):
                    got = success_probability_exact(a, b, n_draws, target, red, seen - red)
                    assert got == enumerated_q(a, b, n_draws, target, red, seen - red), (n_draws, target, red, seen)
                    checked += 1
    assert checked == 210  # Σ_N N (N+1)(N+2)/2 histories × targets


def test_closed_form_equals_scipy_betabinom_tail():
    betabinom = pytest.importorskip("scipy.stats").betabinom
    for a, b, n, k, r, w in [(1, 1, 5, 3, 0, 0), (2, 3, 5, 3, 1, 1), (3, 1, 8, 6, 2, 0), (1, 2, 10, 4, 1, 5)]:
        m = n - r - w
        want = betabinom.sf(k - r - 1, m, a + r, b + w)
        assert success_probability(a, b, n, k, r, w) == pytest.approx(want, abs=1e-12)


def test_counts_outside_the_urn_are_refused():
    with pytest.raises(ValueError):
        success_probability(1, 1, 3, 2, 3, 1)


def simulate(a: int, b: int, n_draws: int, target: int, n: int, seed: int):
    """n episodes by de Finetti's representation (θ ~ Beta(a, b), draws i.i.d. Bernoulli(θ): not the urn), and a
    policy that stops early after a white ball with probability 1/2."""
    rng = np.random.default_rng(seed)
    theta = rng.beta(a, b, size=n)
    draws = rng.random((n, n_draws)) < theta[:, None]
    y = draws.sum(axis=1) >= target
    red_seen = np.concatenate([np.zeros((n, 1), dtype=int), np.cumsum(draws, axis=1)], axis=1)  # after t draws
    stop_after_white = (~draws) & (rng.random((n, n_draws)) < 0.5)
    stopped = np.cumsum(stop_after_white, axis=1) > 0
    n_seen = np.where(stopped.any(axis=1), stopped.argmax(axis=1) + 1, n_draws)  # draws seen at the stop
    return y, red_seen, n_seen


@pytest.mark.parametrize("a,b,n_draws,target", [(1, 1, 5, 3), (2, 1, 5, 4)])
def test_monte_carlo_frequency_of_success_matches_q_t(a, b, n_draws, target):
    n = 100_000
    y, red_seen, n_seen = simulate(a, b, n_draws, target, n, seed=7)
    cells = 0
    for t in range(n_draws):  # every history the agent speaks on (before draw t + 1), only if it has not stopped
        alive = n_seen >= t
        for red in range(t + 1):
            mask = alive & (red_seen[:, t] == red)
            if mask.sum() < 200:
                continue
            q = success_probability(a, b, n_draws, target, red, t - red)
            freq = y[mask].mean()
            half = 4.0 * np.sqrt(max(q * (1 - q), 1e-12) / mask.sum())  # 4 SE: ~1e-4 per cell, 30 cells
            assert abs(freq - q) <= half + 1e-12, (t, red, freq, q)
            cells += 1
    assert cells >= 10
    # at the policy's own stopping time (an optional stopping time): still q
    at_stop = red_seen[np.arange(n), n_seen]
    for k in np.unique(n_seen):
        for red in range(k + 1):
            mask = (n_seen == k) & (at_stop == red)
            if mask.sum() >= 200:
                q = success_probability(a, b, n_draws, target, red, k - red)
                assert abs(y[mask].mean() - q) <= 4.0 * np.sqrt(max(q * (1 - q), 1e-12) / mask.sum()) + 1e-12


def test_monte_carlo_check_can_fail():
    """The same check rejects a wrong formula (q for a Beta(1,1) prior when the urn starts 2 red, 1 white)."""
    y, red_seen, _ = simulate(2, 1, 5, 4, 100_000, seed=7)
    mask = red_seen[:, 1] == 0
    q_wrong = success_probability(1, 1, 5, 4, 0, 1)
    assert abs(y[mask].mean() - q_wrong) > 4.0 * np.sqrt(q_wrong * (1 - q_wrong) / mask.sum())


def run_env(task_id: str, actions: list[str], n_draws: int = 5):
    env = UrnEnv(task_id, n_draws)

    async def go():
        prompt = await env.reset()
        out = []
        for act in actions:
            out.append(await env.step(act))
            if out[-1].done:
                break
        return prompt, out

    return env, asyncio.run(go())


def test_environment_records_q_t_before_each_observation_and_the_outcome():
    task = "urn-0003"
    env, (prompt, responses) = run_env(task, ["Draw[]"] * 5)
    a, b, k = task_parameters(task, 5)
    draws = hidden_draws(task, a, b, 5)
    assert f"{a} red and {b} white" in prompt and f"at least {k} of the 5" in prompt
    assert len(responses) == 5 and responses[-1].done and not any(r.done for r in responses[:-1])
    for t, resp in enumerate(responses):
        red = sum(draws[:t])
        assert resp.info[Q_T_KEY] == success_probability(a, b, 5, k, red, t - red)
    assert responses[-1].outcome == int(sum(draws) >= k)
    assert responses[0].info[Q_T_KEY] == float(success_probability_exact(a, b, 5, k, 0, 0))


def test_stopping_early_does_not_change_the_outcome():
    for i in range(20):
        task = f"urn-{i:04d}"
        _, (_, full) = run_env(task, ["Draw[]"] * 5)
        _, (_, early) = run_env(task, ["Draw[]", "Stop[]"])
        assert early[-1].done and early[-1].outcome == full[-1].outcome
        assert early[1].info[Q_T_KEY] == full[1].info[Q_T_KEY]


def test_bad_actions_are_repairable_and_change_nothing():
    env = UrnEnv("urn-0001", 5)
    asyncio.run(env.reset())
    for bad in ("Draw[1]", "draw[]", "Finish[1]"):
        with pytest.raises(InvalidAction, match="Draw\\[\\] or Stop\\[\\]"):
            asyncio.run(env.step(bad))
    assert env.seen == 0


def test_the_domains_tasks_succeed_as_often_as_q_1_says():
    """Over the 1000 listed tasks, Σ Y and Σ q_1 agree within 4 SE: the hidden sequences follow the urn."""
    domain = get_domain_class("urn")({})
    ids = domain.all_task_ids()
    assert len(ids) == 1000 and len(set(ids)) == 1000
    q1, y = [], []
    for task in ids:
        a, b, k = task_parameters(task, 5)
        q1.append(success_probability(a, b, 5, k, 0, 0))
        y.append(sum(hidden_draws(task, a, b, 5)) >= k)
    q1, y = np.array(q1), np.array(y, dtype=float)
    assert abs(y.sum() - q1.sum()) <= 4 * np.sqrt((q1 * (1 - q1)).sum())
    assert q1.min() < 0.2 and q1.max() > 0.8  # the tasks span the probability range


def test_options_are_validated():
    from uqh.rundir.errors import UserError

    with pytest.raises(UserError, match="n_draws must be a positive integer"):
        get_domain_class("urn")({"n_draws": 0})
    assert len(get_domain_class("urn")({"n_tasks": 7}).all_task_ids()) == 7

"""Several endpoints for one model (uqh/harness/model/endpoints.py): spreading by least in-flight, a conversation sent
back to the endpoint holding its prefix, a failing endpoint taken out of rotation and retried later, failover on a refused connection, per-endpoint counts in the summary and the
manifest -- through real HTTP against fake servers, on the in-process and the --workers paths (the Ray backend's
are in tests/test_ray_backend.py)."""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import socket

import pytest

from uqh.cli import main
from uqh.harness.model.endpoints import (AFFINITY_SLACK, EndpointCounts, EndpointPool, endpoint_summary_lines,
                                     merge_counts, prefix_digests)
from uqh.harness.model.client import make_model_client
from uqh.harness.model.call_errors import EndpointUnreachable
from uqh.harness.runner import run_batch
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import DecodingConfig, RunConfig
from uqh.harness.config.settings import BatchSettings
from test_runner import make_config, solver

STEP = "<think>t</think>\n<action>Finish[1]</action>\n<confidence>0.5</confidence>\n<explanation>e</explanation>"
MESSAGES = [{"role": "user", "content": "hi"}]


def _client(urls, **kw):
    kw.setdefault("max_retries", 4)
    return make_model_client("openai/fake", api_base=urls[0], api_bases=urls, decoding=DecodingConfig(max_tokens=32),
                             timeout_s=5, backoff_initial_s=0.001, backoff_max_s=0.005, **kw)


def _on_manual_clock(client) -> tuple[EndpointPool, list[float]]:
    """The client's endpoint pool with its cooldown clock read from ``now[0]`` (advance it by hand)."""
    pool: EndpointPool = client.transport
    now = [0.0]
    pool._clock = lambda: now[0]
    return pool, now


def _calls(client, n, concurrency):
    async def go():
        sem = asyncio.Semaphore(concurrency)

        async def one():
            async with sem:
                return await client.complete(MESSAGES)

        try:
            return await asyncio.gather(*(one() for _ in range(n)))
        finally:
            await client.aclose()

    return asyncio.run(go())


def _closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there: connections are refused
    return f"http://127.0.0.1:{port}/v1"


def test_calls_spread_by_least_in_flight(fake_server):
    with fake_server(STEP, latency_s=0.02) as a, fake_server(STEP, latency_s=0.02) as b:
        client = _client([a.base_url, b.base_url])
        _calls(client, 40, concurrency=8)
        counts = {c.url: c for c in client.endpoint_counts()}
    assert a.n_requests + b.n_requests == 40
    assert abs(a.n_requests - b.n_requests) <= 4  # equal speed: an even split (8 in flight, 4 each)
    assert counts[a.base_url].calls == a.n_requests and counts[b.base_url].calls == b.n_requests
    assert a.max_in_flight <= 5 and b.max_in_flight <= 5


def test_a_slow_endpoint_gets_fewer_calls(fake_server):
    with fake_server(STEP, latency_s=0.5) as slow, fake_server(STEP, latency_s=0.01) as fast:
        _calls(_client([slow.base_url, fast.base_url]), 40, concurrency=4)
    assert slow.n_requests + fast.n_requests == 40
    # least in-flight: the fast one frees its slots sooner (0.5 s against 0.01 s, so that a loaded machine, where the
    # fast one takes tens of ms, still shows it)
    assert fast.n_requests >= 3 * slow.n_requests


def test_prefix_digests_name_exactly_the_shared_prefixes():
    a = [{"role": "system", "content": "S"}, {"role": "user", "content": "task 1"}, {"role": "assistant", "content": "x"}]
    b = [*a[:2], {"role": "assistant", "content": "y"}]
    assert len(prefix_digests(a)) == 3
    assert prefix_digests(a)[:2] == prefix_digests(b)[:2] and prefix_digests(a)[2] != prefix_digests(b)[2]
    assert prefix_digests(a[:2]) == prefix_digests(a)[:2]  # a request's digests are its continuation's prefixes
    # no message boundary can be forged by content, and every field counts
    assert prefix_digests([{"content": "ab"}, {"content": "c"}])[1] != prefix_digests([{"content": "a"},
                                                                                      {"content": "bc"}])[1]
    assert prefix_digests([{"role": "user", "content": "S"}]) != prefix_digests([{"role": "system", "content": "S"}])


class _Idle:
    """A transport that is never called (the choice is made before any send)."""

    async def send(self, messages, seed):  # pragma: no cover - not called
        raise AssertionError


def _conversation(task: int, steps: int) -> list[dict]:
    msgs = [{"role": "system", "content": "shared system prompt"}, {"role": "user", "content": f"task {task}"}]
    for k in range(steps):
        msgs += [{"role": "assistant", "content": f"step {k}"}, {"role": "user", "content": f"observation {k}"}]
    return msgs


def test_a_conversation_goes_back_to_its_endpoint_unless_that_one_is_busier_than_the_slack():
    pool = EndpointPool(["a", "b", "c"], [_Idle(), _Idle(), _Idle()])
    first = pool._choose(set(), prefix_digests(_conversation(1, 0)))
    assert first == 0  # nothing cached anywhere: least in-flight, then the first listed
    pool._endpoints[0].sent = 1
    # the shared system prompt alone ties nothing: a new task goes to the least busy
    assert pool._choose(set(), prefix_digests(_conversation(2, 0))) == 1
    pool._endpoints[1].sent = 1
    pool._endpoints[0].in_flight = AFFINITY_SLACK  # busier than the others, but within the slack: stays
    assert pool._choose(set(), prefix_digests(_conversation(1, 1))) == 0 and pool.affinity_hits == 1
    pool._endpoints[0].in_flight = AFFINITY_SLACK + 1  # beyond it: goes where it waits less, and moves there
    moved = pool._choose(set(), prefix_digests(_conversation(1, 2)))
    assert moved == 2 and pool.affinity_hits == 1
    pool._endpoints[0].in_flight = 0
    assert pool._choose(set(), prefix_digests(_conversation(1, 3))) == 2  # its longest prefix is cached there now
    assert pool._choose({2}, prefix_digests(_conversation(1, 3))) == 0  # excluded (failed over): elsewhere
    pool._endpoints[2].out_until = pool._clock() + 60  # out of rotation: not held to it either
    assert pool._choose(set(), prefix_digests(_conversation(1, 4))) != 2
    off = EndpointPool(["a", "b"], [_Idle(), _Idle()], affinity_slack=None)
    off._choose(set(), prefix_digests(_conversation(1, 0)))
    off._endpoints[0].sent = 1
    assert off._choose(set(), prefix_digests(_conversation(1, 1))) == 1 and off.affinity_hits == 0


def test_with_a_known_capacity_a_conversation_waits_only_when_every_endpoint_is_full():
    """Local servers: capacity = slots per process. A branch whose prefix is on a full process goes to one with a
    free slot (re-reading the prefix there beats waiting for a generation); when all are full it stays."""
    pool = EndpointPool(["a", "b"], [_Idle(), _Idle()], capacity=1)
    branch = prefix_digests(_conversation(1, 2))
    assert pool._choose(set(), branch) == 0
    pool._endpoints[0].in_flight = pool._endpoints[0].sent = 1
    assert pool._choose(set(), branch) == 1  # a's only slot is taken, b's is free
    pool._endpoints[1].in_flight = pool._endpoints[1].sent = 1
    assert pool._choose(set(), branch) == 1 and pool.affinity_hits == 1  # both full: where it was sent last
    roomy = EndpointPool(["a", "b"], [_Idle(), _Idle()], capacity=3)
    assert roomy._choose(set(), branch) == 0
    roomy._endpoints[0].in_flight = 2  # 2 beyond b, past the slack, but a slot is free: it stays
    assert roomy._choose(set(), branch) == 0 and roomy.affinity_hits == 1
    roomy._endpoints[0].in_flight = 3
    assert roomy._choose(set(), branch) == 1
    assert _client(["http://a/v1", "http://b/v1"], endpoint_capacity=2).transport.capacity == 2  # the client's pool


def test_every_step_of_an_episode_goes_to_one_endpoint_and_the_episodes_spread(fake_server, tmp_path, monkeypatch):
    """Through the runner: 12 two-step episodes at concurrency 4 over three endpoints; each endpoint keeps the
    episodes it started (its prompt cache holds them), and every one gets a share. (By fewest in flight alone,
    the fourth episode in flight, which shares an endpoint, moves for its second step.) The slack is lifted so
    that the outcome does not hang on timing; the test above checks the slack."""
    monkeypatch.setitem(EndpointPool.__init__.__kwdefaults__, "affinity_slack", 100)
    with fake_server(solver, latency_s=0.02) as a, fake_server(solver, latency_s=0.02) as b, \
            fake_server(solver, latency_s=0.02) as c:
        servers = {"a": a, "b": b, "c": c}
        urls = [srv.base_url for srv in servers.values()]
        config = make_config(n_tasks=12).model_copy(update={"api_base": urls[0], "api_bases": urls})
        summary = run_batch(config, tmp_path / "run", settings=BatchSettings(concurrency=4, progress=False))
        assert summary.ok and summary.stats.stop_reasons == {"clean": 12}
        served = {name: [r["messages"][1]["content"] for r in srv.requests] for name, srv in servers.items()}
    assert sum(map(len, served.values())) == 24
    for name, tasks in served.items():
        others = {t for other, ts in served.items() if other != name for t in ts}
        assert not set(tasks) & others  # no episode was split between endpoints
        assert tasks


def test_a_failing_endpoint_leaves_the_rotation_with_a_warning_and_is_retried_later(fake_server, caplog):
    caplog.set_level(logging.WARNING, logger="uqh.harness.model.endpoints")
    with fake_server(STEP) as good, fake_server(STEP, faults=["500"] * 1000) as bad:
        client = _client([good.base_url, bad.base_url])
        pool, now = _on_manual_clock(client)
        results = _calls(client, 30, concurrency=1)
        assert len(results) == 30  # every call succeeded (retried on the good endpoint)
        first = {c.url: c for c in client.endpoint_counts()}
        assert first[bad.base_url].failures == 3 and first[bad.base_url].removals == 1
        assert first[bad.base_url].calls == 0 and first[good.base_url].calls == 30 == good.n_requests
        assert pool.in_rotation() == [good.base_url]
        assert "taken out of rotation after 3 failed requests in a row" in caplog.text and bad.base_url in caplog.text
        now[0] += 31.0  # the cooldown (30 s) is over: the endpoint is tried again, fails, and is out for 60 s
        _calls(client, 5, concurrency=1)
        second = {c.url: c for c in client.endpoint_counts()}
        assert second[bad.base_url].failures == 4 and second[bad.base_url].removals == 2
        now[0] += 59.0
        assert pool.in_rotation() == [good.base_url]  # doubled cooldown
        now[0] += 2.0
        assert set(pool.in_rotation()) == {good.base_url, bad.base_url}


def test_an_endpoint_that_recovers_is_back_in_rotation(fake_server, caplog):
    caplog.set_level(logging.WARNING, logger="uqh.harness.model.endpoints")
    with fake_server(STEP) as good, fake_server(STEP, faults=["503"] * 3) as flaky:
        client = _client([good.base_url, flaky.base_url])
        pool, now = _on_manual_clock(client)
        _calls(client, 10, concurrency=1)
        assert pool.in_rotation() == [good.base_url]
        now[0] += 31.0
        # one at a time: every call finds both idle, and the tie goes to the endpoint with fewer sent (the flaky one)
        _calls(client, 10, concurrency=1)
        counts = {c.url: c for c in client.endpoint_counts()}
    assert "answers again: back in rotation" in caplog.text
    assert counts[flaky.base_url].calls >= 3 and counts[flaky.base_url].removals == 1
    assert set(pool.in_rotation()) == {good.base_url, flaky.base_url}


def test_a_bad_request_does_not_count_against_the_endpoint(fake_server):
    with fake_server(STEP) as a, fake_server(STEP, faults=["400"] * 5) as b:
        client = _client([a.base_url, b.base_url], max_retries=0)
        pool: EndpointPool = client.transport
        for _ in range(5):  # least sent: b gets every other call; its 400s fail the call (not retryable)
            try:
                _calls(client, 2, concurrency=1)
            except Exception:  # noqa: BLE001
                pass
        assert set(pool.in_rotation()) == {a.base_url, b.base_url}
        assert {c.url: c.removals for c in client.endpoint_counts()} == {a.base_url: 0, b.base_url: 0}


def test_a_refused_endpoint_fails_over_within_the_call_and_all_refused_is_unreachable(fake_server):
    down = _closed_port_url()
    with fake_server(STEP) as up:
        client = _client([down, up.base_url], max_retries=0)  # no retries: failover must happen inside the call
        _calls(client, 6, concurrency=1)
        counts = {c.url: c for c in client.endpoint_counts()}
    assert counts[up.base_url].calls == 6 and counts[down].calls == 0 and counts[down].failures >= 1
    client = _client([down, _closed_port_url()])
    with pytest.raises(EndpointUnreachable, match="cannot reach any of"):
        _calls(client, 1, concurrency=1)


def test_merge_and_summary_lines():
    merged = merge_counts([EndpointCounts("a", 3, 1, 0)], [EndpointCounts("b", 2), EndpointCounts("a", 4, 0, 1)])
    assert merged == [EndpointCounts("a", 7, 1, 1), EndpointCounts("b", 2, 0, 0)]
    assert endpoint_summary_lines(merged) == [
        "endpoint       a: 7 calls answered, 1 failed; taken out of rotation 1 time",
        "endpoint       b: 2 calls answered",
    ]


# ------------------------------------------------------------------------------------- runs


@pytest.mark.parametrize("workers", [1, 2])
def test_a_run_over_two_endpoints_one_failing(fake_server, tmp_path, workers):
    with fake_server(solver) as good, fake_server(solver, faults=["500"] * 1000) as bad:
        urls = [good.base_url, bad.base_url]
        config = make_config(n_tasks=12).model_copy(update={"api_base": urls[0], "api_bases": urls})
        summary = run_batch(config, tmp_path / "run", settings=BatchSettings(concurrency=4, workers=workers, progress=False))
    assert summary.ok and summary.stats.done == 12 and summary.stats.stop_reasons == {"clean": 12}
    counts = {c.url: c for c in summary.endpoint_calls}
    assert counts[good.base_url].calls == good.n_requests == summary.stats.calls == 24
    # each process keeps its own pool: the failing endpoint is tried FAILURES_TO_REMOVE times per process
    assert counts[bad.base_url].calls == 0 and counts[bad.base_url].removals == workers
    assert counts[bad.base_url].failures == bad.n_requests == 3 * workers
    manifest = RunDir.open(tmp_path / "run").manifest
    assert manifest.config.api_bases == urls and manifest.config.api_base == good.base_url


def test_cli_repeated_api_base_and_endpoints_file(fake_server, tmp_path, capsys):
    with fake_server(solver) as a, fake_server(solver) as b:
        common = ["run", "--domain", "arithmetic", "--tasks", "6", "--model", "openai/fake", "--no-progress"]
        assert main([*common, "--api-base", a.base_url, "--api-base", b.base_url, "--out", str(tmp_path / "r")]) == 0
        out = capsys.readouterr().out
        assert f"endpoint       {a.base_url}: " in out and f"endpoint       {b.base_url}: " in out
        assert a.n_requests > 0 and b.n_requests > 0 and a.n_requests + b.n_requests == 12
        listed = tmp_path / "endpoints.txt"
        listed.write_text(f"# replicas\n{a.base_url}\n\n{b.base_url}  # second\n")
        assert main([*common, "--endpoints", str(listed), "--out", str(tmp_path / "r")]) == 0  # the same run
        assert "episodes       6/6 finished (0 this run, 6 before)" in capsys.readouterr().out
        # where the model is served from is not the experiment: another list (one replica dropped) resumes
        assert main([*common, "--api-base", b.base_url, "--out", str(tmp_path / "r")]) == 0
        assert "episodes       6/6 finished (0 this run, 6 before)" in capsys.readouterr().out
        assert main([*common, "--api-base", b.base_url, "--step-budget", "9", "--out", str(tmp_path / "r")]) == 2
        assert "differs in: step_budget" in capsys.readouterr().err  # anything else still does not
        assert main([*common, "--api-base", a.base_url, "--out", str(tmp_path / "one")]) == 0
    one = RunDir.open(tmp_path / "one").manifest
    assert one.config.api_bases is None and "api_bases" not in json.loads((tmp_path / "one" / "manifest.json")
                                                                          .read_text())["config"]
    assert "endpoint " not in capsys.readouterr().out  # one endpoint: no per-endpoint lines


@pytest.mark.parametrize("argv,fragment", [
    (["--api-base", "http://a/v1", "--api-base", "http://a/v1"], "--api-base http://a/v1 is given twice"),
    (["--api-base", "http://a/v1", "--api-base", "ftp://b"], "is not an http(s) URL"),
    (["--endpoints", "{tmp}/missing.txt"], "--endpoints {tmp}/missing.txt: No such file"),
    (["--endpoints", "{tmp}/empty.txt"], "lists no endpoint"),
])
def test_bad_endpoint_lists_are_one_line_and_write_nothing(tmp_path, capsys, argv, fragment):
    (tmp_path / "empty.txt").write_text("# nothing\n\n")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    rc = main(["run", "--domain", "arithmetic", "--tasks", "2", "--model", "openai/fake", *argv,
               "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and fragment.replace("{tmp}", str(tmp_path)) in err
    assert not (tmp_path / "r").exists()


def test_runs_written_before_keep_their_legacy_hash_and_endpoints_leave_the_hash():
    cfg = RunConfig(domain="arithmetic", task_ids=["a"], model="openai/x", api_base="http://h/v1", step_budget=3,
                    prompt_sha256="p", package_version="0")
    old = cfg.model_dump(mode="json")
    assert "api_bases" not in old  # left out of the manifest while unset
    del old["user_api_base"], old["consensus_stopping"]  # added later, left out of the hash while unset
    expected = hashlib.sha256(json.dumps(old, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert cfg.legacy_config_hash() == expected  # what manifests written before carry
    two = cfg.model_copy(update={"api_bases": ["http://h/v1", "http://i/v1"]})
    assert two.legacy_config_hash() != expected and two.endpoints == ["http://h/v1", "http://i/v1"]
    moved = cfg.model_copy(update={"api_base": "http://localhost:9/v1/", "user_api_base": "http://u/v1"})
    assert two.config_hash() == cfg.config_hash() == moved.config_hash() != expected
    assert cfg.endpoints == ["http://h/v1"]


def test_a_run_resumes_after_its_endpoint_moves_and_records_each_session(fake_server, tmp_path, capsys):
    """Issue 33 item 5: a server restarted on another port, named ``localhost`` and with a trailing ``/``, is where
    the model is served from, not the experiment: the run resumes there, and each session's endpoints are kept."""
    out = tmp_path / "r"
    common = ["run", "--domain", "arithmetic", "--tasks", "3", "--model", "openai/fake", "--no-progress",
              "--out", str(out)]
    with fake_server(solver, faults=["400"]) as first:  # one episode fails on infrastructure: work is left
        assert main([*common, "--api-base", first.base_url]) == 1
    capsys.readouterr()
    with fake_server(solver) as second:
        moved = f"http://localhost:{second.port}/v1/"
        assert main([*common, "--api-base", moved]) == 0
        assert "episodes       3/3 finished (1 this run, 2 before)" in capsys.readouterr().out
    manifest = RunDir.open(out).manifest
    assert [s.endpoints for s in manifest.sessions] == [[first.base_url], [moved]]
    assert manifest.execution.endpoints == [moved] and all(s.started_at for s in manifest.sessions)
    # the config (and the hash that names the run) stay as created
    assert manifest.config.api_base == first.base_url and manifest.config_hash == manifest.config.config_hash()


def test_a_dead_endpoint_trips_the_circuit_breaker_one_line_exit_1_and_resumes(fake_server, tmp_path, capsys):
    """Issue 33 item 6: an endpoint that always answers 500 used to be retried for as long as episodes were left;
    now the batch stops once the breaker's thresholds (recorded in the manifest) are reached."""
    out = tmp_path / "r"
    argv = ["run", "--domain", "arithmetic", "--tasks", "40", "--model", "openai/fake", "--no-progress",
            "--concurrency", "4", "--breaker-failures", "6", "--breaker-window", "0", "--out", str(out)]
    with fake_server(solver, faults=["500"] * 10_000) as dead:
        assert main([*argv, "--api-base", dead.base_url]) == 1
    captured = capsys.readouterr()
    assert dead.n_requests <= 6 + 4  # the row that tripped it, plus calls already in flight
    stop = [ln for ln in captured.out.splitlines() + captured.err.splitlines() if "circuit breaker" in ln]
    assert len(stop) == 1 and "every endpoint failed 6 times in a row" in stop[0]
    assert "re-run the same command to resume" in stop[0]
    execution = RunDir.open(out).manifest.execution
    assert (execution.breaker_failures, execution.breaker_window_s) == (6, 0.0)
    with fake_server(solver) as alive:  # the server is back: the same command resumes and finishes
        assert main([*argv, "--api-base", alive.base_url]) == 0
    assert "episodes       40/40 finished (40 this run, 0 before)" in capsys.readouterr().out


def test_the_breaker_needs_both_a_row_of_failures_and_a_quiet_window():
    from uqh.harness.model.breaker import CircuitBreaker

    now = [0.0]
    breaker = CircuitBreaker(failures=3, window_s=60, clock=lambda: now[0])
    for _ in range(5):
        breaker.failure("HTTP 500")
    assert not breaker.open  # a row of failures, but a success less than a minute ago
    now[0] = 61.0
    assert breaker.open
    breaker.success()
    breaker.failure("HTTP 500")
    now[0] = 200.0
    assert not breaker.open  # a quiet window, but not enough failures in a row

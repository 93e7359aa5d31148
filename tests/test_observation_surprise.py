"""`uqh probe --probe observation_surprise` over a recorded urn run, against the fake server: the value equals the
hand-computed mean NLL of the echoed (or grammar-forced) observation tokens, the chat-replay fallback keeps only
exact replays, a forced reply that is not the observation is missing with the reason, a server without logprobs
gives missing values with the reason, kill -9 and resume leave no duplicate and the probed run byte-identical, and
`uqh score/export/report --probes` carry the predictor (raw: rank metrics only). On the real local llama-server,
grammar forcing gives values, and its logprobs are the model's unconstrained ones."""
import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from uqh.cli import main
from uqh.harness.probes.probe_runner import surprise_from_completion
from uqh.harness.model.echo import completion_prompt
from uqh.harness.model.types import Completion
from uqh.rundir.schema import CallRecord, TokenLogprob
from fake_openai_server import chosen_probability, echo_tokens, tokenize
from run_files import read_episodes
from test_probe import agent_text, digest, probe_lines

# " red" gets probability 0.25 wherever it is scored (its top alternatives: " white" 0.7, " red" 0.25)
SCRIPT = {" red": [(" white", math.log(0.7)), (" red", math.log(0.25))]}


def token_probability(tok: str) -> float:
    """The fake server's probability of a scored token (its documented rule, " red" scripted)."""
    return 0.25 if tok == " red" else chosen_probability(tok)


def observations(ep) -> dict[int, str]:
    """t -> the observation the agent had last received when it wrote step t's reply."""
    return {s.t: (ep.task_prompt if s.t == 1 else ep.steps[s.t - 2].observation) for s in ep.steps}


@pytest.fixture(scope="module")
def urn_run(tmp_path_factory):
    from fake_openai_server import FakeOpenAIServer

    out = tmp_path_factory.mktemp("surprise") / "run"
    with FakeOpenAIServer(lambda body: agent_text("Draw[]", "0.6")) as srv:
        assert main(["run", "--domain", "urn", "-D", "n_draws=3", "--model", "openai/fake", "--api-base",
                     srv.base_url, "--tasks", "4", "--max-tokens", "64", "--out", str(out), "--no-progress"]) == 0
    return out


def probe(run, out, srv, *extra, model="openai/fake"):
    return main(["probe", str(run), "--probe", "observation_surprise", "--model", model, "--api-base",
                 srv.base_url, "--out", str(out), "--no-progress", *extra])


def test_surprise_by_hand_from_tokens():
    def completion(pairs, finish="stop"):
        return Completion(text="".join(t for t, _ in pairs), call=CallRecord(model="m", finish_reason=finish),
                          tokens=[TokenLogprob(token=t, logprob=math.log(p)) for t, p in pairs])

    value, min_prob, n, reason = surprise_from_completion(completion([("Draw", 0.5), (" red", 0.25)]), "Draw red",
                                                          "completion_echo")
    assert reason is None and n == 2 and min_prob == pytest.approx(0.25)
    assert value == pytest.approx((math.log(2) + math.log(4)) / 2)
    _, _, _, reason = surprise_from_completion(completion([("Draw", 0.5), (" blue", 0.2)], "length"), "Draw red",
                                               "chat_replay")
    assert reason.startswith("chat replay: the greedy reply is not the observation (they differ from character 5")
    assert "max_tokens" in reason
    _, _, _, reason = surprise_from_completion(completion([(" red", 0.2)]), "Draw red", "completion_echo")
    assert reason.startswith("completion echo: the tokens from the observation's start do not spell it")
    none = Completion(text="Draw red", tokens=None, call=CallRecord(model="m"))
    assert surprise_from_completion(none, "Draw red", "completion_echo")[3] == "the provider returned no logprobs"


def test_completion_prompt_is_role_lines_then_the_marker_then_the_target():
    prompt, start = completion_prompt([{"role": "system", "content": "S"}, {"role": "assistant", "content": "a"},
                                       {"role": "user", "content": "Draw 1 of 3: red."}])
    assert prompt == "SYSTEM: S\nASSISTANT: a\nTARGET_OUTPUT:\nDraw 1 of 3: red."
    assert prompt[start:] == "Draw 1 of 3: red."


def test_target_tokens_start_at_the_observation_and_a_straddling_token_is_left_out():
    from uqh.harness.model.echo import target_tokens

    prompt, start = "X:\nBc", 3  # the observation is "Bc"
    straddling = {"tokens": ["X", ":\nB", "c"], "token_logprobs": [None, -1.0, -2.0],
                  "top_logprobs": [None, {":\nB": -1.0}, {"c": -2.0, "d": -3.0}], "text_offset": [0, 1, 4]}
    alternatives = [{"token": "c", "logprob": -2.0}, {"token": "d", "logprob": -3.0}]
    assert target_tokens({"logprobs": straddling}, prompt, start) == [
        {"token": "c", "logprob": -2.0, "top_logprobs": alternatives}]
    clean = {"tokens": ["X", ":", "\n", "B", "c"], "token_logprobs": [None, -1.0, -0.5, -0.1, -2.0]}  # no offsets
    assert [t["token"] for t in target_tokens({"logprobs": clean}, prompt, start)] == ["B", "c"]
    assert target_tokens({"logprobs": None}, prompt, start) is None


def test_echo_of_one_observation_equals_the_literal_hand_computation():
    """Through the model client and the echo transport: Draw(0.9) 1(0.7) of(0.8) 3(0.7) :(0.6) red(0.25) .(0.6)."""
    from fake_openai_server import FakeOpenAIServer
    from uqh.harness.probes.probe_runner import probe_decoding, surprise_clients_factory
    from uqh.rundir.probes import ProbeKind

    async def score(base_url):
        clients = surprise_clients_factory(probe_decoding(5, probe=ProbeKind.observation_surprise), None)(
            "openai/fake", base_url)
        try:
            return await clients.echo.complete([{"role": "system", "content": "S"},
                                                {"role": "user", "content": "Draw 1 of 3: red."}], seed=1)
        finally:
            await clients.aclose()

    with FakeOpenAIServer("unused", scripted_logprobs=SCRIPT) as srv:
        completion = asyncio.run(score(srv.base_url))
        body = srv.completion_requests[0]
    value, min_prob, n, reason = surprise_from_completion(completion, "Draw 1 of 3: red.", "completion_echo")
    probs = [0.9, 0.7, 0.8, 0.7, 0.6, 0.25, 0.6]
    assert reason is None and n == 7 and min_prob == pytest.approx(0.25)
    assert value == pytest.approx(-sum(math.log(p) for p in probs) / 7, abs=1e-12)
    assert body["echo"] is True and body["max_tokens"] == 1 and body["logprobs"] == 5  # the generated token: cut
    assert body["prompt"] == "SYSTEM: S\nTARGET_OUTPUT:\nDraw 1 of 3: red."


def test_surprise_equals_the_hand_computed_nll_of_the_echo_tokens(urn_run, tmp_path, capsys):
    from fake_openai_server import FakeOpenAIServer

    before = digest(urn_run)
    out = tmp_path / "os"
    with FakeOpenAIServer("unused", scripted_logprobs=SCRIPT) as srv:
        assert probe(urn_run, out, srv) == 0
        prompts = [r["prompt"] for r in srv.completion_requests]
        assert srv.requests == []  # every observation went through echo: no chat call
    eps = {e.episode_id: e for e in read_episodes(urn_run)}
    lines = probe_lines(out)
    assert len(lines) == sum(e.n_steps for e in eps.values()) == len(prompts)
    for v in lines:
        obs = observations(eps[v["episode_id"]])[v["t"]]
        probs = [token_probability(tok) for tok in echo_tokens(obs)]
        assert v["missing_reason"] is None and v["method"] == "completion_echo" and v["scorer_mode"] == "agent"
        assert v["value"] == pytest.approx(-sum(map(math.log, probs)) / len(probs), abs=1e-12)
        assert v["min_prob"] == pytest.approx(min(probs)) and v["n_tokens"] == len(probs)
    assert digest(urn_run) == before
    # agent mode: the run's system prompt; the scored observation is the prompt's tail, after the marker, and
    # nothing after it (the observation of step t is not in the context of step t's value)
    system_prompt = json.loads((urn_run / "manifest.json").read_text())["system_prompt"]
    ep = next(e for e in eps.values() if e.n_steps >= 2)
    p2 = next(p for p in prompts if p.endswith("\nTARGET_OUTPUT:\n" + ep.steps[0].observation))
    assert p2.startswith("SYSTEM: " + system_prompt) and f"USER: {ep.task_prompt}\nASSISTANT: " in p2
    assert not any(p.endswith(ep.steps[-1].observation) for p in prompts)  # the last observation is never scored
    # scored: the stream is exp(-NLL); raw has the rank metrics only, Platt every metric; the cost is noted
    capsys.readouterr()
    assert main(["score", str(urn_run), "--probes", str(out), "--format", "json", "--bootstrap", "0",
                 "--predictor", "observation_surprise,verbal"]) == 0
    captured = capsys.readouterr()
    rows = {(r["predictor"], r["calibration"]): r for r in json.loads(captured.out)["rows"]}
    raw, platt = rows[("observation_surprise", "raw")], rows[("observation_surprise", "platt")]
    assert raw["n_used"] == len(eps) and "rank metrics only" in raw["note"]
    assert {m["metric"] for m in raw["metrics"]} <= {"auroc", "auprc", "aurc", "auarc", "spearman_failure",
                                                     "kendall_failure"}
    assert "auroc" in {m["metric"] for m in raw["metrics"]}
    assert {"tps", "t_ece", "t_brier", "truth_mae"} <= {m["metric"] for m in platt["metrics"]}
    assert f"probe observation_surprise by openai/fake: {len(lines)} calls" in captured.err


def test_auxiliary_mode_uses_the_observer_prompt(urn_run, tmp_path):
    from fake_openai_server import FakeOpenAIServer

    out = tmp_path / "aux"
    with FakeOpenAIServer("unused", scripted_logprobs=SCRIPT) as srv:
        assert probe(urn_run, out, srv, "--limit", "1", model="openai/observer") == 0
        prompts = [r["prompt"] for r in srv.completion_requests]
    system_prompt = json.loads((urn_run / "manifest.json").read_text())["system_prompt"]
    assert prompts and all(p.startswith("SYSTEM: You are watching an agent work on a task") for p in prompts)
    assert all(system_prompt in p for p in prompts)
    assert {v["scorer_mode"] for v in probe_lines(out)} == {"auxiliary"}


def test_chat_replay_keeps_only_exact_reproductions(urn_run, tmp_path):
    """A server refusing echo (as llama-server does): once refused, every observation is replayed by chat; a reply
    that is the observation gives its tokens' NLL, any other reply a missing value with the reason."""
    from fake_openai_server import FakeOpenAIServer

    eps = read_episodes(urn_run)
    ep = next(e for e in eps if e.n_steps >= 2)

    def reply(body):  # reproduces step 1's observation of `ep` at its step 2; anything else is wrong
        msgs = body["messages"]
        hit = len(msgs) == 3 and msgs[1]["content"] == ep.task_prompt
        return ep.steps[0].observation if hit else "Draw 9 of 9: blue."

    out = tmp_path / "replay"
    with FakeOpenAIServer(reply, completions_echo=False) as srv:
        assert probe(urn_run, out, srv, "--concurrency", "1") == 0
        n_echo = len(srv.completion_requests)
    lines = probe_lines(out)
    assert n_echo == 1 and len(lines) == sum(e.n_steps for e in eps)  # echo refused once, then not asked again
    assert all(v["method"] == "chat_replay" and "Only no echo is supported" in v["echo_refused"] for v in lines)
    exact = [v for v in lines if v["value"] is not None]
    assert [(v["episode_id"], v["t"]) for v in exact] == [(ep.episode_id, 2)]
    probs = [chosen_probability(tok) for tok in tokenize(ep.steps[0].observation)]  # chat tokens: fake rule
    assert exact[0]["value"] == pytest.approx(-sum(map(math.log, probs)) / len(probs), abs=1e-12)
    missing = [v for v in lines if v["value"] is None]
    assert missing and all(v["missing_reason"].startswith("chat replay: the greedy reply is not the observation")
                           for v in missing)


def test_a_server_without_logprobs_gives_missing_values_with_the_reason(urn_run, tmp_path):
    from fake_openai_server import FakeOpenAIServer

    out = tmp_path / "nolp"
    with FakeOpenAIServer("unused", logprobs=False) as srv:
        assert probe(urn_run, out, srv) == 0
    lines = probe_lines(out)
    assert lines and all(v["value"] is None and v["missing_reason"] == "the provider returned no logprobs"
                         for v in lines)


def test_kill_9_and_resume_leave_no_duplicate_and_the_run_untouched(urn_run, tmp_path):
    from fake_openai_server import FakeOpenAIServer

    before = digest(urn_run)
    out = tmp_path / "killed"
    n_planned = sum(e.n_steps for e in read_episodes(urn_run))
    cmd = [sys.executable, "-m", "uqh.cli", "probe", str(urn_run), "--probe", "observation_surprise", "--model",
           "openai/fake", "--out", str(out), "--concurrency", "1", "--no-progress"]
    env = {**os.environ, "OPENAI_API_KEY": "sk-fake"}
    with FakeOpenAIServer("unused", scripted_logprobs=SCRIPT, latency_s=0.15) as srv:
        proc = subprocess.Popen(cmd + ["--api-base", srv.base_url], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)
        deadline = time.time() + 60
        while time.time() < deadline:
            f = out / "probes.jsonl"
            if f.exists() and f.read_bytes().count(b"\n") >= 2:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        partial = (out / "probes.jsonl").read_bytes().count(b"\n")
        assert 2 <= partial < n_planned
        with open(out / "probes.jsonl", "ab") as f:  # a torn last line, as a crash mid-write leaves
            f.write(b'{"schema_version": 1, "run": 0, "epi')
        done = subprocess.run(cmd + ["--api-base", srv.base_url], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "removed a torn last line" in done.stdout
    lines = probe_lines(out)
    keys = [(v["run"], v["episode_id"], v["t"], v["probe"]) for v in lines]
    assert len(keys) == len(set(keys)) == n_planned
    assert f"{n_planned - partial} this run, {partial} before" in done.stdout
    assert all(v["value"] is not None for v in lines)
    assert digest(urn_run) == before


def test_export_and_report_carry_the_predictor(urn_run, tmp_path):
    import csv

    import pandas as pd
    from fake_openai_server import FakeOpenAIServer

    out = tmp_path / "os"
    with FakeOpenAIServer("unused", scripted_logprobs=SCRIPT) as srv:
        assert probe(urn_run, out, srv, "--limit", "2") == 0
    assert main(["export", str(urn_run), "--to", str(tmp_path / "x"), "--format", "csv", "--bootstrap", "0",
                 "--probes", str(out)]) == 0
    steps = pd.read_csv(tmp_path / "x" / "steps.csv")
    probed = steps["observation_surprise"].notna()
    assert probed.sum() == len(probe_lines(out)) and 0 < probed.sum() < len(steps)  # --limit 2: the rest missing
    nll = {(v["episode_id"], v["t"]): v["value"] for v in probe_lines(out)}
    for _, row in steps[probed].iterrows():  # the exported stream is the confidence exp(-NLL)
        assert row["observation_surprise"] == pytest.approx(math.exp(-nll[(row["episode"], row["t"])]))
    rep = tmp_path / "rep"
    assert main(["report", str(urn_run), "--out", str(rep), "--bootstrap", "5", "--probes", str(out)]) == 0
    rows = {r["Predictor"]: r for r in csv.DictReader(open(next(rep.rglob("transparency__*.csv"))))}
    assert any(name.startswith("Observation surprise") for name in rows)


def test_user_mistakes_are_one_line_and_write_nothing(urn_run, tmp_path, capsys):
    out = tmp_path / "bad"
    with pytest.raises(SystemExit) as exc:  # argparse's own exit: one line, status 2
        main(["probe", str(urn_run), "--probe", "observation_surprize", "--model", "openai/fake", "--api-base",
              "http://127.0.0.1:9/v1", "--out", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "observation_surprize" in err and len(err.strip().splitlines()) == 1 and not out.exists()
    from fake_openai_server import FakeOpenAIServer

    with FakeOpenAIServer("Yes") as srv:  # a p_true directory is not resumed as observation_surprise
        assert main(["probe", str(urn_run), "--probe", "p_true", "--model", "openai/fake", "--api-base",
                     srv.base_url, "--out", str(out), "--limit", "1", "--no-progress"]) == 0
        before = digest(out)
        capsys.readouterr()
        assert probe(urn_run, out, srv) == 2
    err = capsys.readouterr().err
    assert "different probe config (differs in: " in err and "probe" in err and digest(out) == before


def test_gbnf_string_escapes_quotes_backslashes_and_control_characters():
    from uqh.harness.model.forced import forced_max_tokens, gbnf_string, literal_grammar

    assert gbnf_string('say "hi" \\ x\n\t\r\x01\x7f é 🎲 [a]') == (
        '"say \\"hi\\" \\\\ x\\n\\t\\r\\x01\\x7F é 🎲 [a]"')
    assert literal_grammar("") == 'root ::= ""\n'
    assert forced_max_tokens("é🎲") == 2 + 4 + 1  # a token carries at least one byte; then the end token


def forced_score(base_url, messages, top_logprobs=5, model="openai/fake"):
    from uqh.harness.probes.probe_runner import probe_decoding, surprise_clients_factory
    from uqh.rundir.probes import ProbeKind

    async def score():
        clients = surprise_clients_factory(probe_decoding(top_logprobs, probe=ProbeKind.observation_surprise), None,
                                           ("grammar_forced",))(model, base_url)
        try:
            assert clients.echo is None and clients.echo_refused is None
            return await clients.forced.complete(messages, seed=1)
        finally:
            await clients.aclose()

    return asyncio.run(score())


def test_forcing_one_observation_equals_the_literal_hand_computation():
    """Through the model client and the forcing transport: the server sees the conversation without the
    observation and a grammar admitting only it; Draw(0.9) 1(0.7) of(0.8) 3(0.7) :(0.6) red(0.25) .(0.6)."""
    from fake_openai_server import FakeOpenAIServer

    messages = [{"role": "system", "content": "S"}, {"role": "assistant", "content": "a"},
                {"role": "user", "content": "Draw 1 of 3: red."}]
    with FakeOpenAIServer("unused", scripted_logprobs=SCRIPT) as srv:
        completion = forced_score(srv.base_url, messages)
        body = srv.requests[0]
    assert srv.completion_requests == []
    assert body["grammar"] == 'root ::= "Draw 1 of 3: red."\n' and body["messages"] == messages[:-1]
    assert body["temperature"] == 0.0 and body["logprobs"] is True and body["top_logprobs"] == 5
    assert body["post_sampling_probs"] is False and body["max_tokens"] == len("Draw 1 of 3: red.") + 1
    value, min_prob, n, reason = surprise_from_completion(completion, "Draw 1 of 3: red.", "grammar_forced")
    probs = [0.9, 0.7, 0.8, 0.7, 0.6, 0.25, 0.6]
    assert reason is None and n == 7 and min_prob == pytest.approx(0.25)
    assert value == pytest.approx(-sum(math.log(p) for p in probs) / 7, abs=1e-12)


def test_forced_surprise_equals_the_hand_computed_nll_over_a_run(urn_run, tmp_path):
    """--surprise-method forced: no echo is asked; every value is the forced tokens' mean NLL; every request's
    grammar spells exactly the scored observation (escapes included: the fake decodes them as llama.cpp does)."""
    from fake_openai_server import FakeOpenAIServer, gbnf_literal_text

    before = digest(urn_run)
    out = tmp_path / "forced"
    with FakeOpenAIServer("unused", scripted_logprobs=SCRIPT) as srv:
        assert probe(urn_run, out, srv, "--surprise-method", "forced") == 0
        bodies = list(srv.requests)
        assert srv.completion_requests == []
    eps = {e.episode_id: e for e in read_episodes(urn_run)}
    lines = probe_lines(out)
    assert len(lines) == len(bodies) == sum(e.n_steps for e in eps.values())
    for v in lines:
        obs = observations(eps[v["episode_id"]])[v["t"]]
        probs = [token_probability(tok) for tok in tokenize(obs)]
        assert v["method"] == "grammar_forced" and v["missing_reason"] is None and v["echo_refused"] is None
        assert v["value"] == pytest.approx(-sum(map(math.log, probs)) / len(probs), abs=1e-12)
        assert v["n_tokens"] == len(probs) and v["min_prob"] == pytest.approx(min(probs))
    forced_texts = sorted(gbnf_literal_text(b["grammar"]) for b in bodies)
    assert forced_texts == sorted(observations(eps[v["episode_id"]])[v["t"]] for v in lines)
    assert all(b["messages"][-1]["role"] != "user" or b["messages"][-1]["content"] not in forced_texts
               for b in bodies)  # the observation is forced, never part of the context
    assert json.loads((out / "probe_manifest.json").read_text())["config"]["surprise_method"] == "forced"
    assert digest(urn_run) == before


def test_a_forced_reply_that_is_not_the_observation_is_missing_with_the_reason(urn_run, tmp_path):
    """A server that ignores the grammar: a different reply, or a reply cut at max_tokens, is missing."""
    from fake_openai_server import FakeOpenAIServer

    out = tmp_path / "ignored"
    with FakeOpenAIServer("Draw 9 of 9: blue.", honour_grammar=False) as srv:
        assert probe(urn_run, out, srv, "--surprise-method", "forced", "--limit", "1") == 0
    lines = probe_lines(out)
    assert lines and all(v["value"] is None and v["method"] == "grammar_forced" for v in lines)
    assert all(v["missing_reason"].startswith("grammar forcing: the reply is not the observation (they differ from "
                                              "character ") for v in lines)
    assert all("did not apply the grammar" in v["missing_reason"] for v in lines)
    out = tmp_path / "cut"
    with FakeOpenAIServer(lambda body: "word " * 600, honour_grammar=False) as srv:
        assert probe(urn_run, out, srv, "--surprise-method", "forced", "--limit", "1") == 0
    assert all("(the reply stopped at max_tokens)" in v["missing_reason"] for v in probe_lines(out))


def test_the_method_option_is_recorded_and_guards_resume(urn_run, tmp_path, capsys):
    from fake_openai_server import FakeOpenAIServer

    out = tmp_path / "echo_only"
    with FakeOpenAIServer("Draw", completions_echo=False) as srv:  # echo only, refused: missing, no replay
        assert probe(urn_run, out, srv, "--surprise-method", "echo", "--limit", "1") == 0
        assert srv.requests == []
        lines = probe_lines(out)
        assert lines and all(v["value"] is None and v["method"] == "completion_echo" for v in lines)
        assert all(v["missing_reason"].startswith("completion_echo: the endpoint refused /v1/completions echo "
                                                  "(HTTP 500: Only no echo is supported)") for v in lines)
        before = digest(out)
        capsys.readouterr()
        assert probe(urn_run, out, srv, "--surprise-method", "replay", "--limit", "1") == 2
        err = capsys.readouterr().err
        assert "differs in: " in err and "surprise_method" in err and len(err.strip().splitlines()) == 1
        assert digest(out) == before
        bad = tmp_path / "bad"
        assert main(["probe", str(urn_run), "--probe", "p_true", "--model", "openai/fake", "--api-base",
                     srv.base_url, "--out", str(bad), "--surprise-method", "forced"]) == 2
        err = capsys.readouterr().err
        assert err.strip() == "uqh probe: error: --surprise-method applies to --probe observation_surprise only"
        assert not bad.exists()
        assert probe(urn_run, tmp_path / "dry", srv, "--dry-run") == 0  # the default: auto, no forcing for a URL
        assert "; methods completion_echo -> chat_replay" in capsys.readouterr().out
        assert not (tmp_path / "dry").exists()


def test_p_true_configs_keep_their_hash():
    """The new field is out of the hash while null: probe directories made before it still resume."""
    from uqh.rundir.probes import ProbeConfig, ProbeKind
    from uqh.rundir.schema import DecodingConfig

    config = ProbeConfig(runs=[], probe=ProbeKind.p_true, model="m", decoding=DecodingConfig(), prompt_sha256="0",
                         package_version="0")
    data = {k: v for k, v in config.model_dump(mode="json").items() if k not in ("api_base", "surprise_method")}
    import hashlib

    expected = hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert config.config_hash() == expected
    assert config.model_copy(update={"surprise_method": "auto"}).config_hash() != expected


def test_local_llama_server_forced_values_are_its_unconstrained_logprobs(urn_run, tmp_path):
    """The real local model (llama.cpp's llama-server refuses echo): `auto` forces every observation by grammar and
    every value exists. The forced tokens' logprobs equal those of an unconstrained greedy reply at the positions
    where that reply has the same tokens (within 1e-3), and a forced unlikely first token is reported with its
    low probability, not ~1: the logprobs are the model's, before the grammar."""
    from uqh.harness.model.client import make_model_client
    from uqh.harness.model.llama_server import resolve_model
    from uqh.rundir.schema import DecodingConfig

    out = tmp_path / "local"
    assert main(["probe", str(urn_run), "--probe", "observation_surprise", "--model", "local:smollm2", "--out",
                 str(out), "--limit", "1", "--concurrency", "1", "--no-progress"]) == 0
    lines = probe_lines(out)
    assert lines and all(v["method"] == "grammar_forced" and v["scorer_mode"] == "auxiliary" for v in lines)
    assert all("HTTP 500: Only no echo is supported" in v["echo_refused"] for v in lines)
    assert all(v["value"] is not None and v["value"] > 0 and v["n_tokens"] >= 1 for v in lines)

    ep = next(e for e in read_episodes(urn_run) if e.episode_id == lines[0]["episode_id"])
    observation = ep.steps[0].observation if ep.n_steps >= 2 else ep.task_prompt
    context = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": ep.task_prompt}]
    greedy_decoding = DecodingConfig(temperature=0.0, logprobs=True, top_logprobs=5, max_tokens=24, seed=1)

    async def greedy_reply(litellm_model, api_base):
        greedy = make_model_client(litellm_model, api_base=api_base, decoding=greedy_decoding)
        try:
            return await greedy.complete(context, seed=1)
        finally:
            await greedy.aclose()

    with resolve_model("local:smollm2") as (litellm_model, api_base):
        free = asyncio.run(greedy_reply(litellm_model, api_base))
        # the greedy reply's own text with something after it, an unlikely opening, the observation, escapes
        texts = [free.text + "\nDraw", "Zebra " + observation, observation,
                 'He said "hi" \\ back\nCafé — naïve 🎲 中文\ttab [x]\x01']  # llama.cpp parses the escapes
        forced = [forced_score(api_base, context + [{"role": "user", "content": text}], model=litellm_model)
                  for text in texts]
    assert len(free.tokens) >= 3
    for text, completion in zip(texts, forced):
        assert "".join(t.token for t in completion.tokens) == text
    same = 0
    for a, b in zip(free.tokens, forced[0].tokens):
        if a.token != b.token:
            break
        assert b.logprob == pytest.approx(a.logprob, abs=1e-3)
        same += 1
    assert same >= 3
    first = forced[1].tokens[0]
    assert first.token.startswith("Z") and first.logprob < -5
    assert first.top_logprobs[0].token != first.token and first.top_logprobs[0].logprob > first.logprob + 3

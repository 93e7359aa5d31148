"""`uqh probe`'s write path: per-step probes over the episodes of recorded runs, into a probe directory.

It reuses the judge's runner (:func:`uqh.harness.judge.judge_runner.run_sidecar`): the same directory store (append +
fsync, torn tail cut, finished keys skipped on resume, a changed config refused), concurrency, retries,
accounting and cost. The probed runs are only read.

``p_true`` (reflexive P(True), Kadavath et al. 2022): at every recorded step t, the conversation exactly as the
agent had it when it produced step t's reply -- system prompt, task, steps 1..t-1 with their observations, and step
t's attempts, without step t's observation -- followed by the fixed question of ``prompts/probes/p_true.txt``. P(True)
is read from the top alternatives of the first non-blank answer token, normalised over the two options
(:func:`p_true_from_tokens`).

``observation_surprise`` (agentuq's ``score-observation-uq``): at every recorded step t, the observation the agent
had last received when it wrote step t's reply -- the task prompt at t = 1, step t-1's observation after -- is
scored token by token given everything before it, and the value is its mean NLL per token (the minimum token
probability is kept next to it). The observation of the last step is never scored: it comes after the last
decision (and in some domains it reveals the outcome). ``agent`` mode uses the probed run's own system prompt and
conversation (the probing model is the run's model); ``auxiliary`` mode (another model) replaces the system prompt
by the observer prompt ``prompts/probes/observation_surprise.txt`` followed by the run's system prompt.
Teacher forcing goes through ``/v1/completions`` with ``echo`` (:mod:`uqh.harness.model.echo`) where the endpoint
serves it; on a ``local:`` model (llama-server, which refuses echo) through grammar-forced decoding
(:mod:`uqh.harness.model.forced`); elsewhere a chat reply is asked for and kept only when it reproduces the
observation exactly (the exact-match check). ``--surprise-method`` (:data:`SURPRISE_METHOD_ORDER`) picks one
method instead. Either way a value whose tokens do not spell the observation is missing with the reason
(:func:`surprise_from_completion`).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from uqh.harness.episode.loop import build_messages, derive_seed
from uqh.harness.judge.judge_runner import JudgeSummary, SidecarLayout, run_sidecar
from uqh.harness.model.echo import EchoTransport, EchoUnsupported
from uqh.harness.model.call_errors import ModelCallFailed
from uqh.harness.model.forced import ForcedTransport
from uqh.harness.model.transports import Endpoint
from uqh.harness.model.types import Completion
from uqh.harness.progress import EpisodeSummary
from uqh.prompts import PROMPTS_DIR
from uqh.rundir.judgments import JudgedRun
from uqh.rundir.probes import (
    PROBE_MANIFEST_FILE,
    PROBES_FILE,
    ProbeConfig,
    ProbeDir,
    ProbeKind,
    ProbeManifest,
    ProbeValue,
    SurpriseMethod,
    probe_config_differences,
)
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import CallRecord, DecodingConfig, Episode, TokenLogprob

#: The answer options of ``p_true``: the first is "True". A top alternative counts for an option when its text,
#: stripped and lower-cased, equals it (``Yes``, `` yes`` and ``yes`` all count for ``yes``).
P_TRUE_OPTIONS = ("yes", "no")


def prompt_path(probe: ProbeKind):
    return PROMPTS_DIR / "probes" / f"{probe.value}.txt"


def prompt_sha256(probe: ProbeKind) -> str:
    return hashlib.sha256(prompt_path(probe).read_bytes()).hexdigest()


#: observation_surprise's chat-replay fallback: the reply may run this many tokens (an observation longer than
#: that cannot be reproduced, and is missing with the reason).
REPLAY_MAX_TOKENS = 256
#: seconds an echo call may take (the model client's default timeout)
ECHO_TIMEOUT_S = 600.0


def probe_decoding(top_logprobs: int, seed: int = 42, probe: ProbeKind = ProbeKind.p_true) -> DecodingConfig:
    """Greedy with logprobs (``top_logprobs`` alternatives); p_true: a few tokens (the answer is one word);
    observation_surprise: room for a chat replay of an observation."""
    max_tokens = REPLAY_MAX_TOKENS if probe is ProbeKind.observation_surprise else 4
    return DecodingConfig(temperature=0.0, logprobs=True, top_logprobs=top_logprobs, max_tokens=max_tokens, seed=seed)


def _probe_manifest(config: ProbeConfig) -> ProbeManifest:
    return ProbeManifest(config=config, config_hash=config.config_hash(),
                         created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))


PROBE_LAYOUT = SidecarLayout("probe directory", "probe values", "probed", PROBE_MANIFEST_FILE, PROBES_FILE,
                             ProbeDir.open, lambda reader: {v.key for v in reader.values()}, _probe_manifest,
                             probe_config_differences)


@dataclass(frozen=True)
class ProbeTask:
    """One probe to make: ``probe`` at step ``t`` of ``episode`` of probed run ``run``."""

    run: int
    episode: Episode
    t: int
    probe: ProbeKind
    seed: int
    system_prompt: str
    question: str  # p_true: the question; observation_surprise: the observer prompt (auxiliary mode)
    mode: str | None = None  # observation_surprise: "agent" or "auxiliary"

    @property
    def key(self) -> tuple[int, str, int, str]:
        return (self.run, self.episode.episode_id, self.t, self.probe.value)


def plan_probes(config: ProbeConfig, readers: list[RunDir], *, limit: int | None = None) -> list[ProbeTask]:
    """Every probe of the plan: per run, its first ``limit`` episodes in canonical order (all when None) x steps."""
    question = prompt_path(config.probe).read_text()
    tasks = []
    for k, (reader, run) in enumerate(zip(readers, config.runs)):
        episodes = sorted(reader.episodes(), key=reader.config.episode_sort_key())
        for ep in episodes[:limit] if limit is not None else episodes:
            for step in ep.steps:
                seed = derive_seed(config.decoding.seed, f"probe|{run.config_hash[:16]}|{ep.episode_id}|{step.t}")
                tasks.append(ProbeTask(k, ep, step.t, config.probe, seed, reader.manifest.system_prompt, question,
                                       scorer_mode(config.model, run.model)))
    return tasks


def scorer_mode(probing_model: str, run_model: str) -> str:
    """observation_surprise's mode: ``agent`` when the probing model is the probed run's, else ``auxiliary``."""
    return "agent" if probing_model == run_model else "auxiliary"


def p_true_messages(task: ProbeTask) -> list[dict]:
    """The agent's conversation up to its reply at step t (no observation of step t), then the question."""
    ep = task.episode
    messages = build_messages(task.system_prompt, ep.task_prompt, ep.steps[: task.t])[:-1]
    return messages + [{"role": "user", "content": task.question}]


def p_true_from_tokens(tokens: list[TokenLogprob] | None) -> tuple[float | None, dict[str, float | None], str | None]:
    """(P(True), option -> log probability mass, missing reason) from the answer's tokens.

    The answer token is the first token with non-blank text. Each option's mass is the summed probability of the
    distinct alternatives (the token itself included) spelling it; P(True) = m_yes / (m_yes + m_no). An option
    absent from the top alternatives gets mass 0 (its log is null in the record, so the bound is visible);
    neither present, no logprobs or no answer token: missing with the reason.
    """
    if tokens is None:
        return None, {}, "the provider returned no logprobs"
    answer = next((tok for tok in tokens if tok.token.strip()), None)
    if answer is None:
        return None, {}, "the reply has no non-blank token"
    seen: dict[str, float] = {}
    for alt in [(answer.token, answer.logprob)] + [(a.token, a.logprob) for a in answer.top_logprobs]:
        seen[alt[0]] = max(seen.get(alt[0], -math.inf), alt[1])  # an alternative listed twice counts once
    mass = {o: sum(math.exp(lp) for tok, lp in seen.items() if tok.strip().lower() == o) for o in P_TRUE_OPTIONS}
    logs = {o: (math.log(m) if m > 0 else None) for o, m in mass.items()}
    total = sum(mass.values())
    if total == 0:
        return None, logs, (f"neither {' nor '.join(P_TRUE_OPTIONS)} is among the {len(seen)} top alternatives of "
                            f"the answer token {answer.token!r}")
    return mass[P_TRUE_OPTIONS[0]] / total, logs, None


def observation_messages(task: ProbeTask) -> list[dict]:
    """What the agent had seen before the observation that step t's reply answered (the system prompt chosen by
    the mode), then that observation as the last message, bare (without the harness's ``Observation:`` prefix)."""
    ep = task.episode
    if task.t == 1:
        context, observation = build_messages(task.system_prompt, ep.task_prompt, [])[:1], ep.task_prompt
    else:
        context = build_messages(task.system_prompt, ep.task_prompt, ep.steps[: task.t - 1])[:-1]
        observation = ep.steps[task.t - 2].observation
    if task.mode == "auxiliary":
        context[0] = {"role": "system", "content": f"{task.question.rstrip()}\n\n{task.system_prompt}"}
    return context + [{"role": "user", "content": observation}]


def surprise_from_completion(
    completion: Completion, observation: str, method: str
) -> tuple[float | None, float | None, int | None, str | None]:
    """(mean NLL per token, min token probability, token count, missing reason) of the observation.

    The tokens count only when they spell the observation exactly: an echo whose first target token straddles the
    marker, a chat replay whose greedy reply is not the observation (its tokens would score the model's own
    text, not the observation) or a forced reply that is not it (a server ignoring the grammar) is missing with
    the reason."""
    tokens = completion.tokens
    if tokens is None:
        return None, None, None, "the provider returned no logprobs"
    text = "".join(t.token for t in tokens)
    if text != observation:
        at = next((i for i, (a, b) in enumerate(zip(text, observation)) if a != b), min(len(text), len(observation)))
        cut = " (the reply stopped at max_tokens)" if completion.call.finish_reason == "length" else ""
        if method == "chat_replay":
            return None, None, None, (f"chat replay: the greedy reply is not the observation (they differ from "
                                      f"character {at} of {len(observation)}){cut}; no teacher forcing without echo")
        if method == "grammar_forced":
            return None, None, None, (f"grammar forcing: the reply is not the observation (they differ from "
                                      f"character {at} of {len(observation)}){cut}; the server did not apply the "
                                      f"grammar")
        return None, None, None, (f"completion echo: the tokens from the observation's start do not spell it "
                                  f"(they differ from character {at})")
    if not tokens:
        return None, None, None, "the observation has no tokens to score"
    lps = [t.logprob for t in tokens]
    return -sum(lps) / len(lps), math.exp(min(lps)), len(lps), None


#: observation_surprise's methods in the order ``auto`` tries them (``--surprise-method`` picks one): the
#: method's name in ``ProbeValue.method``. ``auto`` uses grammar forcing only where uqh knows the server takes a
#: GBNF grammar: a ``local:`` model, served by llama-server.
SURPRISE_METHOD_ORDER = (("echo", "completion_echo"), ("forced", "grammar_forced"), ("replay", "chat_replay"))


def surprise_methods(method: SurpriseMethod, model: str) -> tuple[str, ...]:
    """The methods (ProbeValue.method names) a probe run may use, in order, for ``--surprise-method`` ``method``
    and the probing model string as given."""
    if method != "auto":
        return tuple(name for key, name in SURPRISE_METHOD_ORDER if key == method)
    forced_ok = model.startswith("local:")
    return tuple(name for key, name in SURPRISE_METHOD_ORDER if key != "forced" or forced_ok)


@dataclass
class SurpriseClients:
    """observation_surprise's clients: ``echo`` (``/v1/completions`` echo), ``forced`` (grammar-forced chat) -- each
    None without an OpenAI-compatible URL or when ``methods`` leaves it out -- and ``chat`` (the replay).
    ``echo_refused`` is set once the endpoint refused echo, so the later calls skip it."""

    chat: Any
    echo: Any | None
    echo_refused: str | None = None
    forced: Any | None = None
    methods: tuple[str, ...] = ("completion_echo", "chat_replay")

    async def aclose(self) -> None:
        for c in (self.chat, self.echo, self.forced):
            if c is not None:
                await c.aclose()


def surprise_clients_factory(decoding: DecodingConfig, chat_factory: Callable[[str, str | None], Any] | None,
                             methods: tuple[str, ...] = ("completion_echo", "chat_replay"),
                             timeout_s: float | None = None):
    """A runner ``client_factory`` making :class:`SurpriseClients` for ``methods`` (the chat one by ``chat_factory``
    when given); ``timeout_s`` per call of any of them (None: :data:`ECHO_TIMEOUT_S`, the client's default)."""
    timeout = ECHO_TIMEOUT_S if timeout_s is None else timeout_s

    def make(litellm_model: str, api_base: str | None) -> SurpriseClients:
        import os

        from uqh.harness.model.client import make_model_client

        if chat_factory is not None:
            chat = chat_factory(litellm_model, api_base)
        else:
            chat = make_model_client(litellm_model, api_base=api_base, decoding=decoding, timeout_s=timeout)
        echo, forced, refused = None, None, None
        if litellm_model.startswith("openai/") and api_base is not None:
            key = os.environ.get("OPENAI_API_KEY") or "sk-no-key"
            endpoint = Endpoint(litellm_model, api_base, key, timeout, decoding)
            if "completion_echo" in methods:
                echo = make_model_client(litellm_model, api_base=api_base, decoding=decoding, api_key=key,
                                         transport=EchoTransport(endpoint))
            if "grammar_forced" in methods:
                forced = make_model_client(litellm_model, api_base=api_base, decoding=decoding, api_key=key,
                                           transport=ForcedTransport(endpoint))
        elif "completion_echo" in methods:
            refused = "completion echo needs an OpenAI-compatible endpoint (openai/NAME with --api-base)"
        return SurpriseClients(chat, echo, refused, forced, methods)

    return make


def _no_method_left(task: ProbeTask, clients: SurpriseClients, model: str) -> ProbeValue:
    """The value when the only allowed method cannot be used (echo refused with ``--surprise-method echo``, or
    forcing without an OpenAI-compatible URL): missing with the reason; no tokens were served."""
    wanted = clients.methods[0] if clients.methods else "none"
    why = clients.echo_refused if wanted == "completion_echo" else (
        "grammar forcing needs an OpenAI-compatible endpoint (openai/NAME with --api-base)")
    return ProbeValue(run=task.run, episode_id=task.episode.episode_id, t=task.t, probe=task.probe, value=None,
                      missing_reason=f"{wanted}: {why}", call=CallRecord(model=model),
                      probed_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), scorer_mode=task.mode,
                      method=wanted, echo_refused=clients.echo_refused if wanted == "completion_echo" else None)


async def surprise_one(clients: SurpriseClients, task: ProbeTask) -> ProbeValue:
    """One observation scored by the first usable method of ``clients.methods``: echo until the endpoint refuses
    it, then grammar forcing (where allowed), then the chat replay. ModelCallFailed of a call that should have
    worked propagates (not a value: a re-run retries it)."""
    messages = observation_messages(task)
    observation = messages[-1]["content"]
    completion, method = None, None
    if clients.echo is not None and clients.echo_refused is None:
        try:
            completion, method = await clients.echo.complete(messages, seed=task.seed), "completion_echo"
        except ModelCallFailed as exc:
            if not isinstance(exc.__cause__, EchoUnsupported):
                raise
            clients.echo_refused = f"the endpoint refused /v1/completions echo ({exc.__cause__})"
    if completion is None and clients.forced is not None:
        completion, method = await clients.forced.complete(messages, seed=task.seed), "grammar_forced"
    if completion is None and "chat_replay" in clients.methods:
        completion, method = await clients.chat.complete(messages[:-1], seed=task.seed), "chat_replay"
    if completion is None:
        return _no_method_left(task, clients, getattr(clients.chat, "model", "unknown"))
    value, min_prob, n, reason = surprise_from_completion(completion, observation, method)
    return ProbeValue(run=task.run, episode_id=task.episode.episode_id, t=task.t, probe=task.probe, value=value,
                      missing_reason=reason, raw_text=completion.text if method == "chat_replay" else "",
                      call=completion.call, probed_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      scorer_mode=task.mode, method=method, n_tokens=n, min_prob=min_prob,
                      echo_refused=clients.echo_refused if method != "completion_echo" else None)


async def probe_one(client, task: ProbeTask) -> ProbeValue:
    """One probe call (no repair: the value comes from logprobs, not from parsing). ModelCallFailed propagates."""
    if task.probe is ProbeKind.observation_surprise:
        return await surprise_one(client, task)
    completion = await client.complete(p_true_messages(task), seed=task.seed)
    value, logs, reason = p_true_from_tokens(completion.tokens)
    return ProbeValue(run=task.run, episode_id=task.episode.episode_id, t=task.t, probe=task.probe, value=value,
                      missing_reason=reason, option_logprobs=logs, raw_text=completion.text, call=completion.call,
                      probed_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def probe_summary(v: ProbeValue) -> EpisodeSummary:
    """The accounting of one probe call, in the runner's progress terms (``stop_reason`` scored/missing)."""
    out = EpisodeSummary(stop_reason="scored" if v.value is not None else "missing")
    out.add_call(v.call)
    return out


def build_probe_config(readers: list[RunDir], probe: ProbeKind, model: str, api_base: str | None,
                       decoding: DecodingConfig, surprise_method: SurpriseMethod | None = None) -> ProbeConfig:
    """The probe's config; ``surprise_method`` (observation_surprise only) defaults to ``auto``."""
    from uqh import __version__

    runs = [JudgedRun(path=str(r.path.resolve()), config_hash=r.manifest.config_hash, domain=r.config.domain,
                      model=r.config.model) for r in readers]
    if probe is ProbeKind.observation_surprise and surprise_method is None:
        surprise_method = "auto"
    return ProbeConfig(runs=runs, probe=probe, model=model, api_base=api_base, decoding=decoding,
                       prompt_sha256=prompt_sha256(probe), package_version=__version__,
                       surprise_method=surprise_method)


def run_probes(config: ProbeConfig, readers: list[RunDir], out: Path | str, *, limit: int | None = None,
               concurrency: int = 8, progress: bool = True,
               client_factory: Callable[[str, str | None], Any] | None = None,
               timeout_s: float | None = None) -> JudgeSummary:
    """Make (or resume) every planned probe value into ``out`` with the judge's runner; return the summary.
    ``timeout_s``: seconds per call (None: the client's default)."""
    tasks = plan_probes(config, readers, limit=limit)
    if config.probe is ProbeKind.observation_surprise:
        methods = surprise_methods(config.surprise_method or "auto", config.model)
        client_factory = surprise_clients_factory(config.decoding, client_factory, methods, timeout_s)
    return run_sidecar(config, PROBE_LAYOUT, tasks, Path(out), probe_one, probe_summary, model=config.model,
                       concurrency=concurrency, progress=progress, label="uqh probe", client_factory=client_factory,
                       timeout_s=timeout_s)

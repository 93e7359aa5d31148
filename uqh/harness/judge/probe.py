"""`uqh probe`'s write path: per-step probes over the episodes of recorded runs, into a probe directory.

It reuses the judge's runner (:func:`uqh.harness.judge.runner.run_sidecar`): the same directory store (append +
fsync, torn tail cut, finished keys skipped on resume, a changed config refused), concurrency, retries,
accounting and cost. The probed runs are only read.

``p_true`` (reflexive P(True), Kadavath et al. 2022): at every recorded step t, the conversation exactly as the
agent had it when it produced step t's reply -- system prompt, task, steps 1..t-1 with their observations, and step
t's attempts, without step t's observation -- followed by the fixed question of ``prompts/probes/p_true.txt``. P(True)
is read from the top alternatives of the first non-blank answer token, normalised over the two options
(:func:`p_true_from_tokens`).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from uqh.harness.episode.loop import build_messages, derive_seed
from uqh.harness.judge.runner import JudgeSummary, SidecarLayout, run_sidecar
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
    probe_config_differences,
)
from uqh.rundir.reader import RunDir
from uqh.rundir.schema import DecodingConfig, Episode, TokenLogprob

#: The answer options of ``p_true``: the first is "True". A top alternative counts for an option when its text,
#: stripped and lower-cased, equals it (``Yes``, `` yes`` and ``yes`` all count for ``yes``).
P_TRUE_OPTIONS = ("yes", "no")


def prompt_path(probe: ProbeKind):
    return PROMPTS_DIR / "probes" / f"{probe.value}.txt"


def prompt_sha256(probe: ProbeKind) -> str:
    return hashlib.sha256(prompt_path(probe).read_bytes()).hexdigest()


def probe_decoding(top_logprobs: int, seed: int = 42) -> DecodingConfig:
    """Greedy, a few tokens (the answer is one word), logprobs with ``top_logprobs`` alternatives."""
    return DecodingConfig(temperature=0.0, logprobs=True, top_logprobs=top_logprobs, max_tokens=4, seed=seed)


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
    question: str

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
                tasks.append(ProbeTask(k, ep, step.t, config.probe, seed, reader.manifest.system_prompt, question))
    return tasks


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


async def probe_one(client, task: ProbeTask) -> ProbeValue:
    """One probe call (no repair: the value comes from logprobs, not from parsing). ModelCallFailed propagates."""
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
                       decoding: DecodingConfig) -> ProbeConfig:
    from uqh import __version__

    runs = [JudgedRun(path=str(r.path.resolve()), config_hash=r.manifest.config_hash, domain=r.config.domain,
                      model=r.config.model) for r in readers]
    return ProbeConfig(runs=runs, probe=probe, model=model, api_base=api_base, decoding=decoding,
                       prompt_sha256=prompt_sha256(probe), package_version=__version__)


def run_probes(config: ProbeConfig, readers: list[RunDir], out: Path | str, *, limit: int | None = None,
               concurrency: int = 8, progress: bool = True,
               client_factory: Callable[[str, str | None], Any] | None = None) -> JudgeSummary:
    """Make (or resume) every planned probe value into ``out`` with the judge's runner; return the summary."""
    tasks = plan_probes(config, readers, limit=limit)
    return run_sidecar(config, PROBE_LAYOUT, tasks, Path(out), probe_one, probe_summary, model=config.model,
                       concurrency=concurrency, progress=progress, label="uqh probe", client_factory=client_factory)

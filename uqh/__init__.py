"""uqh: agent rollouts with runtime uncertainty capture, scored by trajectory proper scoring rules.

Packages, in the order of the data flow: :mod:`uqh.rundir` (the run directory's contract and only reader) <-
:mod:`uqh.domains` (benchmarks) <- :mod:`uqh.harness` (the write path); :mod:`uqh.rundir` <- :mod:`uqh.scoring`
(pure numpy, typed results) <- :mod:`uqh.reports` (tables, figures, HTML); :mod:`uqh.cli` composes them.
"""
import os

# litellm must not try the network for its cost map at import time.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__version__ = "0.1.0"

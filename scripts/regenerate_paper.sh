#!/usr/bin/env bash
# Regenerate the paper's trajectories and report: a thin wrapper of `uqh regenerate` (uqh/harness/regenerate.py).
#
#   scripts/regenerate_paper.sh [PRESET...] [--quick] [--set PRESET:KEY=VALUE ...] [--dry-run] [--sample N]
#                               [--branches M] [--extra-steps K] [--min-valid N] [--out DIR]
#
# Every preset's run (default paper-all), the continuations of HotpotQA's max-step prefixes (Appendix H.2: a seeded
# sample of 100, ten branches each), then ONE report of every run and continuation under --out (default runs/) in
# runs/report-paper. Re-running resumes. --quick: the four benchmarks on the local model, offline, in minutes.
# `uqh regenerate --help` lists every option; docs/reports.md explains them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
exec "$PY" -m uqh.cli regenerate "$@"

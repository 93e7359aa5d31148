#!/usr/bin/env bash
# Regenerate the paper's trajectories (Appendix K, Tables 15-16) into runs/paper-*/, with resume.
#
#   scripts/regenerate_paper.sh [--dry-run] [PRESET...] [-- extra `uqh run` options, e.g. --model X]
#
# PRESET defaults to every paper preset (paper-strategyqa paper-hotpotqa paper-tau2-{airline,retail,telecom}
# paper-webshop). --dry-run prints the exact plan (tasks, calls, rough token budget) with the same extra options
# (e.g. -D max_hops=60) and calls no model.
# Re-running resumes: episodes already in runs/paper-*/episodes.jsonl are skipped.
# API keys (OPENROUTER_API_KEY) come from the environment or .env; they are never written to a run directory.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3

dry_run=0
presets=()
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) presets+=("$1") ;;
  esac
  shift
done
[ ${#presets[@]} -gt 0 ] || presets=(paper-all)

# Expand groups (paper-all, paper-tau2) into preset names; unknown names fail here, before any run.
expanded=$("$PY" -c '
import sys
from uqh.harness.config.presets import expand
from uqh.rundir.errors import UserError
try:
    for n in sys.argv[1:]:
        print("\n".join(expand(n)))
except UserError as e:
    sys.exit(f"regenerate_paper: error: {e}")
' "${presets[@]}")
mapfile -t names <<<"$expanded"

if [ "$dry_run" = 1 ]; then
  # the plan with exactly the flags the runs get (a group, e.g. paper-all, is planned in one process with a total)
  for name in "${presets[@]}"; do
    "$PY" -m uqh.cli run --preset "$name" --dry-run "${extra[@]}"
  done
  exit 0
fi

for name in "${names[@]}"; do
  echo "== $name"
  "$PY" -m uqh.cli run --preset "$name" "${extra[@]}"
done
echo "done: run directories under runs/paper-*/; next: .venv/bin/uqh audit runs/paper-* && .venv/bin/uqh report runs/paper-* --out runs/report-paper"

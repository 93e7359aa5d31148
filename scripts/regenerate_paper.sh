#!/usr/bin/env bash
# Regenerate the paper's trajectories (Appendix K, Tables 15-16) into runs/paper-*/, with resume.
#
#   scripts/regenerate_paper.sh [--dry-run] [--sample N] [--branches M] [PRESET...] [-- extra `uqh run` options]
#
# PRESET defaults to every paper preset (paper-strategyqa paper-hotpotqa paper-tau2-{airline,retail,telecom}
# paper-webshop). The whole protocol: the runs; with paper-hotpotqa, `uqh continue` on a seeded random sample of
# N = 100 of its max-step prefixes with up to M = 10 branches each (Appendix H.2) into runs/paper-hotpotqa-continue;
# then one `uqh report` of every run (with the continuation) into runs/report-paper. --dry-run prints the plan
# (tasks, calls, rough token budget of each run, the continuation's call bound, the commands) and calls no model.
# Re-running resumes: episodes already in runs/paper-*/episodes.jsonl (and finished branches) are skipped.
# API keys (OPENROUTER_API_KEY) come from the environment or .env; they are never written to a run directory.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3

dry_run=0
sample=100
branches=10
seed=42
presets=()
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --sample) sample="$2"; shift ;;
    --branches) branches="$2"; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
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

run_dirs=()
continue_hotpotqa=0
for name in "${names[@]}"; do
  run_dirs+=("runs/$name")
  [ "$name" = paper-hotpotqa ] && continue_hotpotqa=1
done
cont_dir=runs/paper-hotpotqa-continue
continue_cmd=(uqh continue runs/paper-hotpotqa --sample "$sample" --seed "$seed" --branches "$branches"
              --out "$cont_dir" --no-progress)
report_cmd=(uqh report "${run_dirs[@]}" --pool --out runs/report-paper)
[ "$continue_hotpotqa" = 1 ] && report_cmd+=(--continuations "$cont_dir")

if [ "$dry_run" = 1 ]; then
  # the plan with exactly the flags the runs get (a group, e.g. paper-all, is planned in one process with a total)
  for name in "${presets[@]}"; do
    "$PY" -m uqh.cli run --preset "$name" --dry-run "${extra[@]}"
  done
  if [ "$continue_hotpotqa" = 1 ]; then
    "$PY" - "$sample" "$branches" <<'PLAN'
import sys
from uqh.harness.config.presets import get_preset
sample, branches = int(sys.argv[1]), int(sys.argv[2])
budget = get_preset("paper-hotpotqa").step_budget  # the extra steps of a branch default to the budget
steps = sample * branches * budget
print(f"continuation    paper-hotpotqa: {sample} sampled max-step prefixes x <= {branches} branches x <= {budget} "
      f"extra steps = <= {steps:,} steps; <= {3 * steps:,} model calls with two repairs per step (each call costs "
      "about a HotpotQA step of the plan above, its prompt the prefix's conversation)")
PLAN
  fi
  [ "$continue_hotpotqa" = 1 ] && echo "then            ${continue_cmd[*]}"
  echo "then            ${report_cmd[*]}"
  exit 0
fi

for name in "${names[@]}"; do
  echo "== $name"
  "$PY" -m uqh.cli run --preset "$name" "${extra[@]}"
done
if [ "$continue_hotpotqa" = 1 ]; then
  echo "== continuation of paper-hotpotqa"
  "$PY" -m uqh.cli "${continue_cmd[@]:1}"
fi
echo "== report"
"$PY" -m uqh.cli "${report_cmd[@]:1}"
echo "done: run directories under runs/paper-*/, the report in runs/report-paper/report.html"

#!/usr/bin/env bash
# The whole test suite beside a CPU load of N busy processes (default 10: issue #42's "load 12 on 2 cores").
# Usage: bash scripts/suite_under_load.sh [N] [LOG]   (LOG: .cache/suite_under_load.log) -- exit status is pytest's; the loops are stopped on any exit.
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:-10}
mkdir -p .cache
log=${2:-.cache/suite_under_load.log}  # inside the ignored cache folder
loops=()
stop_loops() { ((${#loops[@]})) && kill "${loops[@]}" 2>/dev/null; wait "${loops[@]}" 2>/dev/null; }
trap stop_loops EXIT
for _ in $(seq "$n"); do
  python3 -c "while True: pass" &
  loops+=($!)
done
start=$(date +%s)
LITELLM_LOCAL_MODEL_COST_MAP=True .venv/bin/python -m pytest -q -n auto --dist loadfile -p no:cacheprovider >"$log" 2>&1
rc=$?
echo "exit $rc, $(( $(date +%s) - start )) s beside $n busy processes, load average at the end $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
exit $rc

#!/usr/bin/env bash
# Offline end-to-end demo on the embedded local model across the four benchmarks:
# run (with the four-tag grammar so the 135M model yields parsed steps), then audit and report.
# Usage: scripts/demo_offline.sh [OUT_DIR]   (default runs/offline-demo; re-running resumes)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/offline-demo}
uqh=.venv/bin/uqh
common=(--model local:smollm2 --grammar --no-progress)
$uqh run --domain strategyqa --tasks 6 --step-budget 4 "${common[@]}" --out "$out/strategyqa"
$uqh run --domain hotpotqa --tasks 4 --step-budget 3 "${common[@]}" --out "$out/hotpotqa"
$uqh run --domain webshop --tasks 3 --step-budget 3 "${common[@]}" --out "$out/webshop"
$uqh run --domain tau2-retail --user-model local:smollm2 --tasks 1 --step-budget 2 "${common[@]}" --out "$out/tau2-retail"
runs=("$out/strategyqa" "$out/hotpotqa" "$out/webshop" "$out/tau2-retail")
$uqh audit "${runs[@]}"
$uqh report "${runs[@]}" --out "$out/report"
echo "demo: report at $out/report/report.html"

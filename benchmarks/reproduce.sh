#!/usr/bin/env bash
# Regenerates docs/results.md's table: every reproduction sweep, then the combined report.
# Scale: permuted-fmnist 4 tasks x 30 rounds x 20 of 125 clients (IID and 2-shard non-IID);
# split-fmnist 5 tasks x 20 rounds x 10 of 125 clients; 9 methods x 3 seeds each (81 runs).
# Completed runs are skipped, so an interrupted reproduction resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
CFL=${CFL:-.venv/bin/cfl}
for setting in pfmnist-iid pfmnist-noniid split-fmnist; do
  "$CFL" sweep "benchmarks/reproduce/$setting.yaml" "$@"
done
"$CFL" report runs/reproduce

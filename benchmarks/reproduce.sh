#!/usr/bin/env bash
# Regenerates docs/results.md's table: every reproduction sweep, then the combined report.
# Scale: permuted-fmnist 4 tasks x 30 rounds x 20 of 125 clients (IID and 2-shard non-IID);
# split-fmnist 5 tasks x 20 rounds x 10 of 125 clients; 9 methods x 3 seeds each (81 runs).
# Two lanes of single-threaded runs keep two cores busy (lane 1: split-fmnist then pfmnist-iid;
# lane 2: pfmnist-noniid); each setting's log is runs/reproduce/<setting>.log.
# Completed runs are skipped, so an interrupted reproduction resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
CFL=${CFL:-.venv/bin/cfl}
mkdir -p runs/reproduce
sweep() { "$CFL" sweep "benchmarks/reproduce/$1.yaml" > "runs/reproduce/$1.log" 2>&1; }
(sweep split-fmnist && sweep pfmnist-iid) & lane1=$!
sweep pfmnist-noniid & lane2=$!
status=0
wait "$lane1" || status=$?
wait "$lane2" || status=$?
tail -n 3 runs/reproduce/*.log
[ "$status" -eq 0 ] || { echo "a reproduction sweep failed (exit $status); see runs/reproduce/*.log" >&2; exit "$status"; }
"$CFL" report runs/reproduce

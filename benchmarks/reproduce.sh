#!/usr/bin/env bash
# Regenerates docs/results.md's table: every reproduction sweep, then the combined report.
# Scale: permuted-fmnist 4 tasks x 30 rounds x 20 of 125 clients (IID and 2-shard non-IID);
# split-fmnist 5 tasks x 20 rounds x 10 of 125 clients; 16 methods (RGO+FL among them) x 3 seeds each
# (144 runs), and GLFC on split-fmnist and pfmnist-noniid (3 runs each, about 12 and 30 minutes a run: docs/methods/glfc.md).
# The runs are single-threaded; JOBS of them run at once (default: one per core). The 81 runs of the first 9
# methods took about 3 core-hours (docs/results.md); the log is runs/reproduce/reproduce.log.
# Completed runs are skipped, so an interrupted reproduction resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
CFL=${CFL:-.venv/bin/cfl}
JOBS=${JOBS:-$(nproc)}
mkdir -p runs/reproduce
"$CFL" sweep benchmarks/reproduce/split-fmnist.yaml benchmarks/reproduce/pfmnist-iid.yaml \
    benchmarks/reproduce/pfmnist-noniid.yaml --jobs "$JOBS" 2>&1 | tee runs/reproduce/reproduce.log
"$CFL" report runs/reproduce

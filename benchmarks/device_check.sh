#!/usr/bin/env bash
# The device check: what runs first on a GPU machine held for a few minutes, as one command (docs/performance.md,
# "The device check"). At most BUDGET_S seconds (default 480) on one GPU:
#   1. the machine (nvidia-smi, torch, the GPU's name) into $OUT/device.json;
#   2. tests/engine/test_device_parity.py on cuda: every registered method on both engines and every model, trained on
#      the GPU and on the CPU in float64, accuracy matrices equal and parameters within 1e-8 (log: $OUT/parity.log);
#   3. benchmarks/perf_engine.py --device cuda for the PMNIST, CIFAR and ResNet setups ($OUT/perf.jsonl: one
#      JSON line each, kernels and host reads per round included);
#   4. the campaign (benchmarks/campaign.py) for the seconds left, packed with its unfinished checkpoints into
#      $OUT/campaign.tar.gz; an archive of an earlier campaign at .campaign/campaign.tar.gz is resumed first.
# Python packages the machine lacks travel as wheels in .whl/ (docs/performance.md says which and how).
#
#   bash benchmarks/device_check.sh            # on the GPU machine (the device tool's run, OUT set by it)
#   bash benchmarks/device_check.sh --dry      # anywhere: the same steps on the CPU, tiny (CI runs this)
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
[ "${1:-}" = "--dry" ] && DRY=1
OUT=${OUT:-$(mktemp -d)}
BUDGET_S=${BUDGET_S:-480}
START=$(date +%s)
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
step() { echo "device_check: $* ($(left) s left)"; }

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  step "installing the carried wheels"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "device_check: the carried wheels did not install"; exit 2; }
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
if [ $DRY = 1 ]; then
  DEVICE=cpu; SETUPS="pmnist"; ROUNDS=1; JOBS=1; CAMPAIGN_MIN=0
else
  DEVICE=cuda; SETUPS="pmnist cifar resnet"; ROUNDS=5; JOBS=${JOBS:-4}; CAMPAIGN_MIN=
fi

step "1/4 the machine"
"$PY" - "$DEVICE" > "$OUT/device.json" <<'EOF' || { echo "device_check: torch cannot use $DEVICE"; exit 2; }
import json, platform, subprocess, sys
import torch
device = sys.argv[1]
info = {"device": device, "torch": torch.__version__, "python": platform.python_version(),
        "cuda_available": torch.cuda.is_available()}
if device == "cuda":
    if not torch.cuda.is_available():
        sys.exit(1)
    info["gpu"] = torch.cuda.get_device_name(0)
    info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                         "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
print(json.dumps(info))
EOF
cat "$OUT/device.json"

step "2/4 device parity tests"
CFL_TEST_DEVICE=$DEVICE timeout $(( $(left) * 2 / 5 )) "$PY" -m pytest -o addopts= -q -p no:cacheprovider \
  tests/engine/test_device_parity.py > "$OUT/parity.log" 2>&1
PARITY=$?
tail -n 5 "$OUT/parity.log"

step "3/4 engine speed"
: > "$OUT/perf.jsonl"
for setup in $SETUPS; do
  timeout 120 "$PY" benchmarks/perf_engine.py --device "$DEVICE" --setup "$setup" --rounds "$ROUNDS" \
    --naive-rounds "$([ $DRY = 1 ] && echo 0 || echo 1)" 2>>"$OUT/perf.err" | tail -n 1 >> "$OUT/perf.jsonl" \
    || echo "device_check: perf_engine --setup $setup did not finish" | tee -a "$OUT/perf.err"
done
cat "$OUT/perf.jsonl"

step "4/4 campaign"
MINUTES=${CAMPAIGN_MIN:-$(( ($(left) - 60) / 60 ))}
[ "$MINUTES" -lt 0 ] && MINUTES=0
UNPACK=()
[ -f .campaign/campaign.tar.gz ] && UNPACK=(--unpack .campaign/campaign.tar.gz)
"$PY" benchmarks/campaign.py run --minutes "$MINUTES" --jobs "$JOBS" --grace 45 --set device="$DEVICE" \
  --work "$OUT/.campaign-work" --results "$OUT/records" --pack "$OUT/campaign.tar.gz" "${UNPACK[@]}" \
  > "$OUT/campaign.log" 2>&1
CAMPAIGN=$?
tail -n 8 "$OUT/campaign.log"
rm -rf "$OUT/.campaign-work" "$OUT/records"  # what the next campaign needs is in the archive

step "done: parity exit $PARITY, campaign exit $CAMPAIGN"
[ $PARITY = 0 ] && [ $CAMPAIGN = 0 ]

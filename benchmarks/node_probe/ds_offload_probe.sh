#!/bin/bash
# Real DeepSpeed ZeRO-3 offload runs on a lent GPU VM (ds_offload_probe.py), with what they
# need: DeepSpeed and its missing dependencies installed from wheels in WHEELS (no network),
# DeepSpeedCPUAdam compiled once (timed), an nvidia-smi log beside the runs.
#   bash ds_offload_probe.sh OUTDIR WHEELS RUNS [BUDGET_S]
# SKIP_CPU_ADAM=1 skips the timed build (runs that offload no optimizer need none);
# ITERATIONS sets the iterations per run (default 6).
set -u
out=$1; wheels=$2; runs=$3; budget=${4:-400}
here=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$wheels"/*.whl || exit 2
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/torch_ext MAX_JOBS=16
{ lscpu; free -b; nvidia-smi; python3 -m pip list 2>/dev/null | grep -i -E "^(torch|transformers|accelerate|deepspeed|pydantic) "; } > "$out/env.txt" 2>&1
# DeepSpeed's op builder reads the compute capabilities as integers and fails on Hopper's
# "9.0a" in torch's own list: name the architecture plainly.
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu,memory.used,clocks_event_reasons.active \
  --format=csv -lms 250 > "$out/clocks.csv" 2>&1 &
smi=$!
if [ "${SKIP_CPU_ADAM:-0}" != 1 ]; then
  t0=$(date +%s.%N)
  python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder as B; b = B(); b.load(); print('cpu_adam simd', b.simd_width(), 'arch', b.cpu_arch())" 2>&1 | tail -5
  echo "cpu_adam build $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}') s"
fi
left=$(( budget - ($(date +%s) - start) ))
python3 "$here/ds_offload_probe.py" --runs "$runs" --out "$out/ds_offload.jsonl" --budget-s "$left" --timeout-s 170 \
  --iterations "${ITERATIONS:-6}" 2>&1 \
  | grep -v -E "FutureWarning|return func|^\s*$|UserWarning|warnings.warn" > "$out/log.txt"
rc=${PIPESTATUS[0]}
kill $smi
grep -E "^run |SUMMARY|Error|error" "$out/log.txt" | tail -40
exit $rc

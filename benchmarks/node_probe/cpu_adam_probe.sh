#!/usr/bin/env bash
# Builds cpu_adam_probe.cpp against a DeepSpeed source checkout, once per SIMD width DeepSpeed's
# builder would choose (op_builder/builder.py: -O3 -std=c++17 -march=native -fopenmp, and
# -D__AVX512__ or -D__AVX256__), and times DeepSpeed's CPU Adam loop: per thread with the four
# arrays in each core's cache (the compute ceiling, `cpu_adam` in zerosim/hardware/cpus.yaml),
# then with all threads over arrays far larger than the caches (what memory gives).
#
# usage: cpu_adam_probe.sh DEEPSPEED_SRC OUT_DIR
#   DEEPSPEED_SRC: a checkout holding csrc/includes/{cpu_adam.h,simd.h} and
#   csrc/adam/cpu_adam_impl.cpp (v0.13.3 is what zerosim's stacks replay).
# Writes OUT_DIR/cpu_adam_probe.jsonl (one JSON object a run, with "simd" and "case" added)
# and OUT_DIR/cpu_adam_machine.txt (lscpu). Needs g++ with OpenMP; no torch, no GPU.
source "$(dirname "$0")/cpu_adam_build.sh"
# cpu_adam_impl.cpp up to its first torch binding (ds_adam_step): the Step_1/4/8 loops.
awk '/^int ds_adam_step\(/ {exit} {print}' "$src/csrc/adam/cpu_adam_impl.cpp" > "$build/steps.cpp"
grep -q "Adam_Optimizer::Step_8" "$build/steps.cpp" || { echo "no Step_8 in $src" >&2; exit 1; }
threads_all=$(nproc)
sizes_cached=${CPU_ADAM_CACHED_PARAMS:-65536}   # 1 MiB of the four fp32 arrays per thread: inside L2
params_memory=${CPU_ADAM_MEMORY_PARAMS:-$((1 << 28))}   # 4 GiB of arrays: far outside the caches
for simd in AVX512 AVX256; do
  bin="$build/adam_$simd"
  if ! g++ -O3 -std=c++17 -march=native -fopenmp -D__${simd}__ -Wno-reorder \
      -I"$build" -I"$src/csrc/includes" "$here/cpu_adam_probe.cpp" "$build/steps.cpp" -o "$bin" \
      2> "$out/build_$simd.log"; then
    echo "build $simd failed (see build_$simd.log)"; continue
  fi
  for t in $(printf '%s\n' 1 2 4 8 "$threads_all" | sort -nu); do
    [ "$t" -le "$threads_all" ] || continue
    r=$(OMP_NUM_THREADS=$t OMP_PROC_BIND=spread "$bin" $sizes_cached 2000)
    echo "{\"simd\": \"$simd\", \"case\": \"cached\", \"run\": $r}" | tee -a "$out/cpu_adam_probe.jsonl"
  done
  for t in 1 $threads_all; do
    r=$(OMP_NUM_THREADS=$t OMP_PROC_BIND=spread "$bin" $((params_memory / t)) 5)
    echo "{\"simd\": \"$simd\", \"case\": \"memory\", \"run\": $r}" | tee -a "$out/cpu_adam_probe.jsonl"
  done
done

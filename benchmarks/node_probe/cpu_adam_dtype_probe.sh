#!/usr/bin/env bash
# Builds cpu_adam_dtype_probe.cpp against a DeepSpeed source checkout of 0.18.3 or later (where
# the CPU Adam loop is a template over the parameter and state dtypes), once per SIMD width its
# builder would choose (-O3 -std=c++17 -march=native -fopenmp, and -D__AVX512__ or -D__AVX256__),
# or neither (-D__SCALAR__, what it builds on a CPU with neither, Arm included),
# and times the loop on one thread with its four arrays in the core's cache, for fp32/fp32,
# bf16/fp32, bf16/bf16, fp16/fp32 and fp16/fp16 (param/state), then with every thread over arrays
# far larger than the caches. With -D__AVX256__ a bf16 pair leaves Step_AVX at once (cpu_adam.h: "#if
# !defined(__AVX512__)") and the scalar Step_1 loop steps every element.
#
# usage: [CPU_ADAM_ROUNDS=5] [CPU_ADAM_AVX256_MARCH=znver3] cpu_adam_dtype_probe.sh DEEPSPEED_SRC OUT_DIR
# Writes OUT_DIR/cpu_adam_dtype_probe.jsonl (one JSON object a run, with "simd" and "case") and
# OUT_DIR/cpu_adam_machine.txt (lscpu). Needs g++ with OpenMP; no torch, no GPU.
source "$(dirname "$0")/cpu_adam_build.sh"
# cpu_adam_impl.cpp up to its torch dispatch (step_invoker and the invoker map): the Step loops.
awk '/^void step_invoker\(/ {exit} {print}' "$src/csrc/adam/cpu_adam_impl.cpp" \
  | sed '$d' > "$build/steps.cpp"
grep -q "Adam_Optimizer::Step_8" "$build/steps.cpp" || { echo "no Step_8 in $src" >&2; exit 1; }
grep -q "ds_state_precision_t" "$build/steps.cpp" || { echo "$src: no dtype templates (needs 0.18.3+)" >&2; exit 1; }
threads_all=$(nproc)
sizes_cached=${CPU_ADAM_CACHED_PARAMS:-65536}
params_memory=${CPU_ADAM_MEMORY_PARAMS:-$((1 << 28))}
rounds=${CPU_ADAM_ROUNDS:-5}
# The AVX256 build is what DeepSpeed compiles on an AVX2-only CPU (AMD Zen 2 and Zen 3): on a
# CPU with AVX-512, CPU_ADAM_AVX256_MARCH (say znver3) makes the compiler generate the code
# -march=native would give there, the scalar fallback included.
march_avx256=${CPU_ADAM_AVX256_MARCH:-native}
builds=()
for simd in AVX512 AVX256 SCALAR; do
  march=native; [ "$simd" = AVX256 ] && march=$march_avx256
  if g++ -O3 -std=c++17 -march=$march -fopenmp -D__${simd}__ -Wno-reorder \
      -I"$build" -I"$src/csrc/includes" "$here/cpu_adam_dtype_probe.cpp" -o "$build/adam_$simd" \
      2> "$out/build_$simd.log"; then
    builds+=("$simd:$march")
  else
    echo "build $simd failed (see build_$simd.log)"
  fi
done
# Cached runs interleaved over rounds, so that a slow spell of a shared machine falls on every
# build and dtype pair alike; the fastest round of each is the core's rate.
for round in $(seq "$rounds"); do
  for b in "${builds[@]}"; do
    simd=${b%%:*}; march=${b#*:}
    for pair in "fp32 fp32" "bf16 fp32" "bf16 bf16" "fp16 fp32" "fp16 fp16"; do
      r=$(OMP_NUM_THREADS=1 "$build/adam_$simd" $sizes_cached 500 $pair)
      echo "{\"simd\": \"$simd\", \"march\": \"$march\", \"case\": \"cached\", \"round\": $round, \"run\": $r}" \
        | tee -a "$out/cpu_adam_dtype_probe.jsonl"
    done
  done
done
for b in "${builds[@]}"; do
  simd=${b%%:*}; march=${b#*:}
  for pair in "fp32 fp32" "bf16 fp32" "bf16 bf16" "fp16 fp32" "fp16 fp16"; do
    r=$(OMP_NUM_THREADS=$threads_all OMP_PROC_BIND=spread "$build/adam_$simd" $((params_memory / threads_all)) 5 $pair)
    echo "{\"simd\": \"$simd\", \"march\": \"$march\", \"case\": \"memory\", \"run\": $r}" \
      | tee -a "$out/cpu_adam_dtype_probe.jsonl"
  done
done

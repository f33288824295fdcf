// Times DeepSpeed's own CPU Adam loop (Adam_Optimizer::Step_8 of csrc/adam/cpu_adam_impl.cpp)
// on this machine's cores, with no PyTorch and no Python in the timed path. Built by
// cpu_adam_probe.sh against a DeepSpeed source checkout: it compiles the checkout's
// cpu_adam_impl.cpp (its Step functions; the torch bindings are cut off) with DeepSpeed's own
// flags. This file holds only the timing harness.
//
// usage: cpu_adam_probe PARAMS_PER_THREAD REPS
// prints one JSON object: threads, params, seconds per step (median), params/s, and the
// scalar clock each thread ran at just before (a chain of dependent adds, one a cycle).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cpu_adam.h"
#include "probe_timing.h"

int main(int argc, char** argv)
{
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s PARAMS_PER_THREAD REPS\n", argv[0]);
        return 2;
    }
    const size_t per_thread = std::strtoull(argv[1], nullptr, 10);
    const int reps = std::atoi(argv[2]);
    const int threads = omp_get_max_threads();
    const size_t n = per_thread * threads;
    float* arrays[4];
    for (auto& a : arrays) a = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
    // First touch by the thread that will step each chunk (static schedule, as Step_AVX's).
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) {
        arrays[0][i] = 1.0f;
        arrays[1][i] = 1e-3f * static_cast<float>((i % 97) + 1);
        arrays[2][i] = 0.0f;
        arrays[3][i] = 0.0f;
    }
    const double clock_GHz = scalar_clock_GHz();
    const std::vector<double> seconds = timed_steps<Adam_Optimizer>(
        reps,
        [&](Adam_Optimizer& opt) { opt.Step_8(arrays[0], arrays[1], arrays[2], arrays[3], n); });
    const double median = seconds[seconds.size() / 2];
    std::printf(
        "{\"threads\": %d, \"params\": %zu, \"reps\": %d, \"median_s\": %.9g, "
        "\"min_s\": %.9g, \"params_per_s\": %.6g, \"params_per_s_per_thread\": %.6g, "
        "\"scalar_clock_GHz\": %.4g, \"check\": %.6g}\n",
        threads, n, reps, median, seconds.front(), n / median, n / median / threads, clock_GHz,
        static_cast<double>(arrays[0][n / 2]));
    for (auto& a : arrays) std::free(a);
    return 0;
}

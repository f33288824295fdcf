// Times DeepSpeed's own CPU Adam loop (Adam_Optimizer::Step_8 of csrc/adam/cpu_adam_impl.cpp,
// DeepSpeed 0.18.3+ where it is a template over the parameter and state dtypes) for the dtype
// pairs DeepSpeedCPUAdam steps: fp32 params and states (the default), bf16 params with fp32
// states (`bf16.bf16_master_weights_and_grads`), bf16 params and states (with
// `bf16.bf16_optimizer_states`), fp16 params with fp32 or fp16 states
// (`fp16.fp16_master_weights_and_grads`, the moments fp16 with `fp32_optimizer_states` off).
// Built by cpu_adam_dtype_probe.sh, which includes the checkout's Step functions into this file
// (one translation unit) with DeepSpeed's own flags.
//
// usage: cpu_adam_dtype_probe PARAMS_PER_THREAD REPS PARAM_DTYPE STATE_DTYPE  (fp32, bf16, fp16)
// prints one JSON object, as cpu_adam_probe does, with the two dtypes added.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "probe_timing.h"
#include "steps.cpp"

template <typename P, typename S>
static int run(size_t per_thread, int reps, const char* p_name, const char* s_name)
{
    const int threads = omp_get_max_threads();
    const size_t n = per_thread * threads;
    auto* params = static_cast<P*>(std::aligned_alloc(64, n * sizeof(P)));
    auto* grads = static_cast<P*>(std::aligned_alloc(64, n * sizeof(P)));
    auto* exp_avg = static_cast<S*>(std::aligned_alloc(64, n * sizeof(S)));
    auto* exp_avg_sq = static_cast<S*>(std::aligned_alloc(64, n * sizeof(S)));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) {
        params[i] = P(1.0f);
        grads[i] = P(1e-3f * static_cast<float>((i % 97) + 1));
        exp_avg[i] = S(0.0f);
        exp_avg_sq[i] = S(0.0f);
    }
    const double clock_GHz = scalar_clock_GHz();
    const std::vector<double> seconds = timed_steps<Adam_Optimizer>(
        reps, [&](Adam_Optimizer& opt) { opt.Step_8(params, grads, exp_avg, exp_avg_sq, n); });
    const double median = seconds[seconds.size() / 2];
    std::printf(
        "{\"param_dtype\": \"%s\", \"state_dtype\": \"%s\", \"threads\": %d, \"params\": %zu, "
        "\"reps\": %d, \"median_s\": %.9g, \"min_s\": %.9g, \"params_per_s\": %.6g, "
        "\"params_per_s_per_thread\": %.6g, \"scalar_clock_GHz\": %.4g, \"check\": %.6g}\n",
        p_name, s_name, threads, n, reps, median, seconds.front(), n / median,
        n / median / threads, clock_GHz, static_cast<double>(static_cast<float>(params[n / 2])));
    std::free(params);
    std::free(grads);
    std::free(exp_avg);
    std::free(exp_avg_sq);
    return 0;
}

int main(int argc, char** argv)
{
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s PARAMS_PER_THREAD REPS PARAM_DTYPE STATE_DTYPE\n", argv[0]);
        return 2;
    }
    const size_t per_thread = std::strtoull(argv[1], nullptr, 10);
    const int reps = std::atoi(argv[2]);
    const std::string p = argv[3], s = argv[4];
    if (p == "fp32" && s == "fp32") return run<float, float>(per_thread, reps, "fp32", "fp32");
    if (p == "bf16" && s == "fp32") return run<c10::BFloat16, float>(per_thread, reps, "bf16", "fp32");
    if (p == "bf16" && s == "bf16")
        return run<c10::BFloat16, c10::BFloat16>(per_thread, reps, "bf16", "bf16");
    if (p == "fp16" && s == "fp32") return run<c10::Half, float>(per_thread, reps, "fp16", "fp32");
    if (p == "fp16" && s == "fp16") return run<c10::Half, c10::Half>(per_thread, reps, "fp16", "fp16");
    std::fprintf(stderr, "dtype pair %s/%s: one of fp32/fp32, bf16/fp32, bf16/bf16, fp16/fp32, fp16/fp16\n",
                 argv[3], argv[4]);
    return 2;
}

// The CPU Adam probes' timing (cpu_adam_probe.cpp, cpu_adam_dtype_probe.cpp).
#pragma once
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <vector>

static double now_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Core clock of each thread, all threads at once: a chain of 8 dependent 64-bit multiplies per
// iteration, 3 cycles each on every x86 core since Nehalem and Zen (the loop's own overhead runs
// beside the chain). Not adds: Golden Cove's renamer folds chains of adds of an immediate.
static double scalar_clock_GHz()
{
    const long iterations = 20000000;
    std::vector<double> ghz(omp_get_max_threads());
#pragma omp parallel
    {
        unsigned long x = omp_get_thread_num();
        double t0 = now_s();
        for (long i = 0; i < iterations; ++i) {
            asm volatile(
                "imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0\n\t"
                "imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0\n\t"
                : "+r"(x));
        }
        ghz[omp_get_thread_num()] = 24.0 * iterations / (now_s() - t0) / 1e9;
    }
    std::sort(ghz.begin(), ghz.end());
    return ghz[ghz.size() / 2];
}

// Megatron-DeepSpeed's optimizer (AdamW, DeepSpeedCPUAdam's default, with weight decay) stepped
// reps + 2 times by `step(opt)`: the seconds of all but the first two, sorted.
template <class Optimizer, class Step>
static std::vector<double> timed_steps(int reps, Step step)
{
    Optimizer opt(1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, true);
    std::vector<double> seconds;
    for (int i = 1; i <= reps + 2; ++i) {
        opt.IncrementStep(i, 0.9f, 0.95f);
        opt.update_state(1e-4f, 1e-8f, 0.1f, true);
        double t0 = now_s();
        step(opt);
        if (i > 2) seconds.push_back(now_s() - t0);
    }
    std::sort(seconds.begin(), seconds.end());
    return seconds;
}

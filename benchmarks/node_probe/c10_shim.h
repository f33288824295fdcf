// The two c10 types DeepSpeed's templated CPU Adam loop names, without PyTorch: BFloat16 as c10
// defines it (c10/util/BFloat16.h and BFloat16-inl.h: a uint16 whose float conversions are a
// shift and a round-to-nearest-even, both inline), and Half as c10/util/Half.h converts it: the
// F16C instructions where the compiler targets them (C10_X86_F16: _cvtss_sh, _cvtsh_ss), else
// the FP16 library's bit arithmetic (fp16_ieee_from_fp32_value, fp16_ieee_to_fp32_value). The
// vector loops convert 16-bit halves with their own instructions (simd.h); these serve the scalar
// loop. Used by cpu_adam_dtype_probe.sh only.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace c10 {
struct BFloat16 {
    uint16_t x;
    BFloat16() = default;
    inline BFloat16(float value)
    {
        if (std::isnan(value)) {
            x = UINT16_C(0x7FC0);
            return;
        }
        uint32_t u32;
        std::memcpy(&u32, &value, sizeof(u32));
        uint32_t rounding_bias = ((u32 >> 16) & 1) + UINT32_C(0x7FFF);
        x = static_cast<uint16_t>((u32 + rounding_bias) >> 16);
    }
    inline operator float() const
    {
        uint32_t u32 = static_cast<uint32_t>(x) << 16;
        float f;
        std::memcpy(&f, &u32, sizeof(f));
        return f;
    }
};
namespace detail {
inline float fp32_from_bits(uint32_t w)
{
    float f;
    std::memcpy(&f, &w, sizeof(f));
    return f;
}
inline uint32_t fp32_to_bits(float f)
{
    uint32_t w;
    std::memcpy(&w, &f, sizeof(w));
    return w;
}
inline float fp16_ieee_to_fp32_value(uint16_t h)
{
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t w = static_cast<uint32_t>(h) << 16;
    const uint32_t sign = w & UINT32_C(0x80000000);
    const uint32_t two_w = w + w;
    const float normalized = fp32_from_bits((two_w >> 4) + (UINT32_C(0xE0) << 23)) * 0x1.0p-112f;
    const float denormalized = fp32_from_bits((two_w >> 17) | (UINT32_C(126) << 23)) - 0.5f;
    const uint32_t result =
        sign | (two_w < (UINT32_C(1) << 27) ? fp32_to_bits(denormalized) : fp32_to_bits(normalized));
    return fp32_from_bits(result);
#endif
}
inline uint16_t fp16_ieee_from_fp32_value(float f)
{
#if defined(__F16C__)
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = fp32_to_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & UINT32_C(0x80000000);
    uint32_t bias = shl1_w & UINT32_C(0xFF000000);
    if (bias < UINT32_C(0x71000000)) bias = UINT32_C(0x71000000);
    base = fp32_from_bits((bias >> 1) + UINT32_C(0x07800000)) + base;
    const uint32_t bits = fp32_to_bits(base);
    const uint32_t exp_bits = (bits >> 13) & UINT32_C(0x00007C00);
    const uint32_t mantissa_bits = bits & UINT32_C(0x00000FFF);
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return static_cast<uint16_t>((sign >> 16) |
                                 (shl1_w > UINT32_C(0xFF000000) ? UINT32_C(0x7E00) : nonsign));
#endif
}
}  // namespace detail
struct Half {
    uint16_t x;
    Half() = default;
    inline Half(float value) : x(detail::fp16_ieee_from_fp32_value(value)) {}
    inline operator float() const { return detail::fp16_ieee_to_fp32_value(x); }
};
}  // namespace c10

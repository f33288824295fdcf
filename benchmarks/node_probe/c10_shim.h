// The two c10 types DeepSpeed's templated CPU Adam loop names, without PyTorch: BFloat16 as c10
// defines it (c10/util/BFloat16.h and BFloat16-inl.h: a uint16 whose float conversions are a
// shift and a round-to-nearest-even, both inline), and Half as an opaque 16-bit type (the probe
// steps no fp16). Used by cpu_adam_dtype_probe.sh only.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

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
struct Half {
    uint16_t x;
};
}  // namespace c10

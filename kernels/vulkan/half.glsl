// half.glsl - halves as the CPU converts them, with integer ops (included by
// the shaders that read or write halves).

// jlm_k_fp16_to_f32, exact (denormals kept)
float fp16(uint h)
{
    uint sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (e == 0x1fu)
        return uintBitsToFloat(sign | 0x7f800000u | (man << 13));
    if (e == 0u) {
        precise float f = float(man) * 5.9604644775390625e-8;   // 2^-24, exact
        return sign != 0u ? -f : f;
    }
    return uintBitsToFloat(sign | ((e + 112u) << 23) | (man << 13));
}

// jlm_k_f32_to_fp16: nearest even, NaN quieted, denormal halves
uint f2h(float f)
{
    uint x = floatBitsToUint(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return sign | 0x7e00u | ((ax >> 13) & 0x3ffu);
    if (ax >= 0x477ff000u)
        return sign | 0x7c00u;
    if (ax < 0x38800000u) {
        precise float s = uintBitsToFloat(ax) * 16777216.0;   // exact: a power of two, below 2^10
        return sign | uint(roundEven(s));
    }
    return sign | ((ax + 0xc8000fffu + ((ax >> 13) & 1u)) >> 13);
}

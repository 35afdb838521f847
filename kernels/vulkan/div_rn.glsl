// div_rn.glsl - the correctly rounded f32 quotient the CPU computes. Vulkan's
// f32 division is 2.5 ulp, so the quotient is a candidate from a double
// division, then the nearest of it and its two neighbours by the exact
// residual |a - c*b| (c*b: 24 + 24 bits, exact in a double; ties to even).
// Needs shaderFloat64.

// fl(a / b) for a >= 0, b > 0 finite
float div_rn(float a, float b)
{
    if (a == 0.0)
        return 0.0;
    float f = float(double(a) / double(b));
    uint u = floatBitsToUint(f);
    float best = f;
    double be = abs(double(a) - double(f) * double(b));
    for (int s = -1; s <= 1; s += 2) {
        if (s < 0 && u == 0u)
            continue;
        float c = uintBitsToFloat(uint(int(u) + s));
        double ce = abs(double(a) - double(c) * double(b));
        if (ce < be || (ce == be && (floatBitsToUint(c) & 1u) == 0u)) {
            best = c;
            be = ce;
        }
    }
    return best;
}

/* dispatch.c - CPU feature detection and the one global kernel table
 * (kernels.h invariant 3). Variants are scored like ggml's cpu-feats: a
 * variant needs all its features; the best one the CPU runs wins unless
 * JLM_CPU names another. */
#include "kernels/cpu/kernels.h"

#include <cpuid.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- features */

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

int jlm_k_cpu_has(int v)
{
    if (v == JLM_K_REF)
        return 1;
    if (v != JLM_K_AVX2 && v != JLM_K_AVX512)
        return 0;
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!(fma && osxsave && avx && f16c))
        return 0;
    uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 0x6) != 0x6)                 /* OS saves XMM and YMM state */
        return 0;
    if (__get_cpuid_max(0, NULL) < 7)
        return 0;
    __cpuid_count(7, 0, a, b, c, d);
    int avx2 = (b >> 5) & 1;
    if (v == JLM_K_AVX2)
        return avx2;
    int f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    int vnni = (c >> 11) & 1;
    return avx2 && f && dq && bw && vl && vnni && (xcr0 & 0xe0) == 0xe0;   /* opmask, ZMM */
}

static const char *const NAMES[JLM_K_NVARIANT] = {"ref", "avx2", "avx512"};

/* Where the AVX-512 kernels prefetch. Measured (docs/kernels.md, "Two
 * AVX-512 builds"): on Zen 4 the L2 hint took one thread's decode 1.2-1.4x
 * past L1; on a Zen 5 EPYC (family 1Ah) L1 decoded 1.04-1.20x faster than L2
 * (Q4_0, Q4_K_M; 1 and 2 threads). AMD from family 1Ah on: L1; every other
 * CPU keeps L2, the hint it had (no Intel CPU with AVX-512 was measured). */
int jlm_k_cpu_pf_default(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d))
        return JLM_K_PF_L2;
    int amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;   /* "AuthenticAMD" */
    if (!amd || !__get_cpuid(1, &a, &b, &c, &d))
        return JLM_K_PF_L2;
    unsigned fam = (a >> 8) & 0xf;
    if (fam == 0xf)
        fam += (a >> 20) & 0xff;
    return fam >= 0x1a ? JLM_K_PF_L1 : JLM_K_PF_L2;
}

/* The prefetch level a table of variant v gets when pf is asked for: 0
 * for the variants with one build, this CPU's default for AUTO. */
static int pf_of(int v, int pf)
{
    if (v != JLM_K_AVX512)
        return 0;
    return pf == JLM_K_PF_AUTO ? jlm_k_cpu_pf_default() : pf;
}

int jlm_k_cpu_variant_by_name(const char *name)
{
    for (int v = 0; v < JLM_K_NVARIANT; v++)
        if (name && !strcmp(name, NAMES[v]))
            return v;
    return -1;
}

/* ---------------------------------------------------------------- tables */

int jlm_k_cpu_table(int v, jlm_k_cpu *t, jlm_err *err)
{
    return jlm_k_cpu_table_pf(v, JLM_K_PF_AUTO, t, err);
}

int jlm_k_cpu_table_pf(int v, int pf, jlm_k_cpu *t, jlm_err *err)
{
    if (v < 0 || v >= JLM_K_NVARIANT)
        return jlm_errf(err, JLM_EINVAL, "kernel variant %d unknown", v);
    if (pf < JLM_K_PF_AUTO || pf > JLM_K_PF_L2)
        return jlm_errf(err, JLM_EINVAL, "prefetch level %d unknown", pf);
    if (!jlm_k_cpu_has(v))
        return jlm_errf(err, JLM_EUNSUPPORTED, "kernel variant %s: this CPU lacks its features",
                        NAMES[v]);
    jlm_k_cpu tab;
    memset(&tab, 0, sizeof tab);
    tab.name = NAMES[v];
    tab.variant = v;
    tab.pf = pf_of(v, pf);
    for (int i = 0; i < JLM_T_COUNT; i++) {
        tab.matvec[i] = jlm_k_matvec_ref;
        tab.matmul[i] = jlm_k_matmul_ref;
        tab.matmul4[i] = jlm_k_matmul_ref;
    }
    tab.quantize_act = jlm_k_quantize_act;
    tab.to_fp16 = jlm_k_to_fp16_ref;
    tab.fattn = jlm_k_fattn_ref;
    tab.swiglu = jlm_k_swiglu;
    if (v == JLM_K_AVX2) {
        jlm_k_fill_avx2(&tab);
        tab.fattn = jlm_k_fattn_avx2;
        tab.swiglu = jlm_k_swiglu_avx2;
    }
    if (v == JLM_K_AVX512) {
        if (tab.pf == JLM_K_PF_L1)
            jlm_k_fill_avx512_l1(&tab);
        else
            jlm_k_fill_avx512(&tab);
        tab.fattn = jlm_k_fattn_avx512;
        tab.swiglu = jlm_k_swiglu_avx512;
    }
    *t = tab;
    return JLM_OK;
}

/* The only global mutable state of kernels/ (invariant 3). */
static jlm_k_cpu g_table;
static int g_ready;

int jlm_k_cpu_init(jlm_err *err)
{
    int best = jlm_k_cpu_has(JLM_K_AVX512) ? JLM_K_AVX512 : jlm_k_cpu_has(JLM_K_AVX2) ? JLM_K_AVX2 : JLM_K_REF;
    int v = best, pf = JLM_K_PF_AUTO, rc = JLM_OK;
    const char *env = getenv("JLM_CPU");
    if (env && *env) {
        int want = jlm_k_cpu_variant_by_name(env);
        if (want < 0 && (!strcmp(env, "avx512-l1") || !strcmp(env, "avx512-l2"))) {
            want = JLM_K_AVX512;
            pf = env[8] == '1' ? JLM_K_PF_L1 : JLM_K_PF_L2;
        }
        if (want < 0) {
            rc = jlm_errf(err, JLM_EINVAL, "JLM_CPU=%s: unknown variant (ref, avx2, avx512, avx512-l1, avx512-l2)",
                          env);
        } else if (!jlm_k_cpu_has(want)) {
            fprintf(stderr, "jlm: JLM_CPU=%s: this CPU lacks its features; using %s\n", env, NAMES[best]);
        } else {
            v = want;
        }
    }
    /* written only when the choice changes: an engine opened while another
     * one computes (jlm serve adding a model) only reads the table */
    pf = pf_of(v, pf);
    if (!g_ready || g_table.variant != v || g_table.pf != pf) {
        jlm_k_cpu_table_pf(v, pf, &g_table, NULL);   /* cannot fail: v is supported */
        g_ready = 1;
    }
    return rc;
}

const jlm_k_cpu *jlm_k_cpu_get(void)
{
    if (!g_ready)
        jlm_k_cpu_init(NULL);
    return &g_table;
}

const char *jlm_k_cpu_variant_name(void)
{
    return jlm_k_cpu_get()->name;
}

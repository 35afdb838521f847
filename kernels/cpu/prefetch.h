/* prefetch.h - the matvec kernels' software prefetch (matvec_avx2.c,
 * matvec_avx512.c): which lines a 16-row step asks for.
 *
 * A pass over the rows reads W+2 streams at once (each word plane of the
 * sub-block, d, sc), each advancing one 64-byte line per 16 rows and only
 * (r1 - r0) * 4 bytes long before the next pass's: too many short streams for
 * the hardware prefetcher, which restarts at every 4 KiB page. Each 16-row
 * step asks for the lines JLM_PF steps ahead in each of its streams: in this
 * pass's planes, or past the thread's last row, in the next pass's planes
 * from its first row on (so a thread never prefetches another thread's rows,
 * and short passes, 512-row K/V at two threads, prefetch the next sub-block
 * instead of nothing). The AVX2 kernels step 8 rows, half a line, and
 * prefetch on the steps that start one ((r & 8) == 0). A prefetch never
 * faults and changes no result. Measured in docs/kernels.md. */
#ifndef JLM_KERNELS_CPU_PREFETCH_H
#define JLM_KERNELS_CPU_PREFETCH_H

#include "kernels/cpu/kernels.h"

#include <immintrin.h>
#include <stdint.h>

#define PF_INLINE static inline __attribute__((always_inline))

#ifndef JLM_PF
#define JLM_PF 32   /* lines ahead; 24-48 measured alike, 12 worse */
#endif

/* Where the lines go. The AVX-512 file is compiled twice, asking for L2
 * (_MM_HINT_T2) and for L1 (T0, matvec_l1_avx512.c), defined before this
 * include: on Zen 4 prefetcht0 left one thread at 0.5-0.65 of the memory
 * probe and T2 took decode 1.2-1.4x further; on Zen 5 T0 decodes 1.04-1.20x
 * faster than T2 (docs/kernels.md). dispatch.c picks the build per CPU. The
 * AVX2 file keeps T0, as first measured (Zen 5): no machine that runs it by
 * default (without AVX-512, Zen 3) was here to compare the hints on. */
#ifndef JLM_PF_HINT
#define JLM_PF_HINT _MM_HINT_T0
#endif

typedef struct pfat { uint64_t r; int nx; } pfat;   /* row r of this pass (nx 0) or the next (nx 1) */

PF_INLINE pfat pf_at(uint64_t r, uint64_t r0, uint64_t nv)
{
    pfat a = { r + 16 * JLM_PF, 0 };
    if (a.r >= nv) {
        a.nx = 1;
        uint64_t o = a.r - nv, len = nv - r0;
        a.r = r0 + (o < len ? o : o % len);
    }
    return a;
}

/* n word planes (4 bytes a row) from plane0, at row r */
PF_INLINE void pf_words(const uint32_t *plane0, uint64_t rows, unsigned n, uint64_t r)
{
    for (unsigned w = 0; w < n; w++)
        _mm_prefetch((const char *)(plane0 + w * rows + r), JLM_PF_HINT);
}

/* Q4_0, Q8_0, Q5_0, Q5_1, MXFP4: sub-block s's W word planes from col (the
 * next pass's follow them) and its d plane of es bytes a row (dcol entries a
 * sub-block) from d. */
PF_INLINE void pf_flat(const uint32_t *col, unsigned W, uint64_t rows, const void *d, uint64_t dcol, unsigned es,
                       uint64_t s, uint64_t r, uint64_t r0, uint64_t nv)
{
    pfat a = pf_at(r, r0, nv);
    pf_words(col + a.nx * W * rows, rows, W, a.r);
    _mm_prefetch((const char *)d + ((s + a.nx) * dcol + a.r) * es, JLM_PF_HINT);
}

/* Q5_0, Q5_1, MXFP4 (sub32_core): Q5_1's d plane is a word (d, b) a row,
 * Q5_0's an f16 and MXFP4's a byte, dcol entries a sub-block. */
PF_INLINE void pf_sub32(const uint32_t *col, unsigned W, uint64_t rows, const void *d, uint64_t dcol, int type,
                        uint64_t s, uint64_t r, uint64_t r0, uint64_t nv)
{
    if (type == JLM_T_Q5_1)
        pf_flat(col, W, rows, d, rows, 4, s, r, r0, nv);
    else
        pf_flat(col, W, rows, d, dcol, type == JLM_T_Q5_0 ? 2 : 1, s, r, r0, nv);
}

/* Q4_K, Q5_K: the pass of KP sub-blocks from s0 (W words each); a
 * super-block's d/dmin word and 3 scale words when the pass prefetched is
 * its first (they are read from DRAM then, from cache after). */
PF_INLINE void pf_k32(const uint32_t *qs, const uint32_t *dp, const uint32_t *scp, uint64_t rows, unsigned W,
                      unsigned KP, uint64_t s0, uint64_t r, uint64_t r0, uint64_t nv)
{
    pfat a = pf_at(r, r0, nv);
    uint64_t ps = s0 + a.nx * KP;
    pf_words(qs + ps * W * rows, rows, KP * W, a.r);
    if (ps % 8 == 0) {
        pf_words(dp + ps / 8 * rows, rows, 1, a.r);
        pf_words(scp + ps / 8 * 3 * rows, rows, 3, a.r);
    }
}

/* Q3_K (W 2), Q6_K (W 3): 32-block b's two halves of W words, its scale word
 * (one per two blocks) and the super-block's d word on its first block. */
PF_INLINE void pf_k16(const uint32_t *qs, const uint32_t *dp, const uint32_t *scp, uint64_t rows, unsigned W,
                      uint64_t b, uint64_t r, uint64_t r0, uint64_t nv)
{
    pfat a = pf_at(r, r0, nv);
    uint64_t pb = b + a.nx;
    pf_words(qs + 2 * pb * W * rows, rows, 2 * W, a.r);
    pf_words(scp + (2 * pb / 4) * rows, rows, 1, a.r);
    if (pb % 8 == 0)
        pf_words(dp + pb / 8 * rows, rows, 1, a.r);
}

#endif

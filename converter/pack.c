/* pack.c - ggml blocks -> .jlm transposed planes (jlm-format.md 7 and 8).
 *
 * One packer per source type turns one GGUF block of one row straight into
 * the words of the qs, d and sc planes. They only move bits, and they move
 * them a byte or a 64-bit word at a time: GGUF's nibble orders and the 7.5
 * nibble rule are close relatives, so each type needs a few masks and shifts
 * per 8 or 16 elements, never a loop over elements (each trick is commented
 * where it is used). No float is computed except for Q2_K, which is
 * re-quantized to Q4_K (see docs/packing.md for the choice and its error).
 *
 * Cost (docs/packing.md "Speed"): one pass over the source, a few tenths of
 * a ns per element. The plane words of one row are `rows` words apart (the
 * layout's point), so blocks are encoded for a tile of 16 rows and stored a
 * 64-byte run per word (store_tile). Q2_K's re-quantization (ggml's
 * quantize_row_q4_K_ref, quantize.c's port shared with `--type`: the
 * make_qkx2_quants search, ~20 passes per 32 elements) costs ~100x more.
 */
#include "converter/pack.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "converter/gguf.h"
#include "converter/quantize.h"
#include "format/jlm_format.h"

/* ---------------------------------------------------------------- type mapping */
int jlm_pack_stored_type(uint32_t ggml_type, uint8_t *jlm_type, int *exact, jlm_err *err)
{
    uint8_t t;
    int ex = 1;
    switch (ggml_type) {
    case GGML_F32:   t = JLM_T_F32; break;
    case GGML_F16:   t = JLM_T_F16; break;
    case GGML_BF16:  t = JLM_T_BF16; break;
    case GGML_Q4_0:  t = JLM_T_Q4_0; break;
    case GGML_Q5_0:  t = JLM_T_Q5_0; break;
    case GGML_Q5_1:  t = JLM_T_Q5_1; break;
    case GGML_Q8_0:  t = JLM_T_Q8_0; break;
    case GGML_Q3_K:  t = JLM_T_Q3_K; break;
    case GGML_Q4_K:  t = JLM_T_Q4_K; break;
    case GGML_Q5_K:  t = JLM_T_Q5_K; break;
    case GGML_Q6_K:  t = JLM_T_Q6_K; break;
    case GGML_MXFP4: t = JLM_T_MXFP4; break;
    case GGML_Q4_1:  t = JLM_T_Q5_1; break;            /* exact: high bit 0 */
    case GGML_Q2_K:  t = JLM_T_Q4_K; ex = 0; break;    /* re-quantized */
    default: {
        const char *n = jlm_ggml_type_name(ggml_type);
        if (n)
            return jlm_errf(err, JLM_EUNSUPPORTED, "ggml type %s has no .jlm stored type", n);
        return jlm_errf(err, JLM_EUNSUPPORTED, "unknown ggml type %u has no .jlm stored type", ggml_type);
    }
    }
    *jlm_type = t;
    *exact = ex;
    return JLM_OK;
}


/* ---------------------------------------------------------------- words and planes */
/* The packers load GGUF bytes and store plane words as native integers
 * (memcpy, so unaligned is fine); both formats are little-endian. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "pack.c assumes a little-endian host: GGUF and .jlm are little-endian"
#endif

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t ld64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

#define LO4 0x0F0F0F0F0F0F0F0Full   /* the low nibble of each of 8 bytes */

/* Plane writes are done a tile at a time: the packers below encode one GGUF
 * block of one row into its plane words, for TILE consecutive rows of one
 * block column, and store_tile then writes each word's TILE rows as one
 * contiguous 64-byte run (7.1 puts a word's consecutive rows side by side).
 * Writing a row at a time instead touches ~W*SuperSub words `rows` words
 * apart per block, all in the same cache set once rows is a large power of
 * two: every store missed L1 and L2 and the packing ran ~3x slower. */
#define TILE 16

/* One block column of a tile; word i of row j of the tile is at [i*TILE + j]. */
typedef struct tile {
    uint32_t q[48 * TILE];   /* W*SuperSub <= 48 payload words (Q6_K) */
    uint32_t d[TILE];        /* the d value: a full word, or the 16/8-bit slot when S > 1 */
    uint32_t sc[4 * TILE];   /* <= 4 sc words (Q3_K, Q6_K) */
} tile;

/* Encodes the block at x into q[i*TILE] (payload word i), *d and sc[i*TILE]. */
typedef void (*blk_enc)(const uint8_t *x, uint32_t *q, uint32_t *d, uint32_t *sc);

/* Payload words i and i+1 from a u64 image of them. */
static inline void put_pair(uint32_t *q, int i, uint64_t v)
{
    q[i * TILE] = (uint32_t)v;
    q[(i + 1) * TILE] = (uint32_t)(v >> 32);
}

/* 7.5 nibble rule from GGUF nibbles, 8 output bytes at a time. a and b hold
 * source bytes 0..7 and n..n+7 of a run whose low (pair_lo) or high (pair_hi)
 * nibbles are the codes 0..2n-1 of one sub-block; output byte j must hold
 * code j low and code j + n high, i.e. nibble of a's byte j | nibble of b's
 * byte j << 4: one mask and one shift per 8 bytes, no per-element work. */
static inline uint64_t pair_lo(uint64_t a, uint64_t b) { return (a & LO4) | (b & LO4) << 4; }
static inline uint64_t pair_hi(uint64_t a, uint64_t b) { return (a >> 4 & LO4) | (b & ~LO4); }

/* 7.5 secondary word of a 32-element sub-block with one high bit each:
 * element l = 4a + b goes to byte b, bit a. Q5_0/Q5_1 give the high bits as
 * one u32, bit l = element l. spread4 moves the 4 bits of nibble a to bit 0
 * of bytes 0..3 with one multiply: n * 0x00204081 puts bit i of n at bit
 * i + 7i = 8i, and since the products i + 7j are all distinct (i < 7) there
 * is no carry, and none but i = j lands on a bit 8b; the mask keeps those. */
static inline uint32_t spread4(uint32_t n) { return (n * 0x00204081u) & 0x01010101u; }

static uint32_t hbits_u32(uint32_t qh)
{
    uint32_t w = 0;
    for (int a = 0; a < 8; a++)
        w |= spread4(qh >> (4 * a) & 15) << a;
    return w;
}

/* The same secondary word when each element's high bits are bits
 * [shift, shift + nbits) of its own byte hb[l] (Q5_K: 1 bit, 32 bytes;
 * Q6_K: 2 bits, 16 bytes). The u32 at hb + 4a holds elements 4a..4a+3 in its
 * bytes, so one shift and a per-byte mask put element 4a + b at byte b, bit
 * 0; << nbits*a moves it to its lane (7.5: offset hi*((l/4) % lanes)). */
static inline uint32_t hbits_bytes(const uint8_t *hb, int shift, int nbits, int groups)
{
    uint32_t mask = nbits == 1 ? 0x01010101u : 0x03030303u, w = 0;
    for (int a = 0; a < groups; a++)
        w |= (ld32(hb + 4 * a) >> shift & mask) << (nbits * a);
    return w;
}

/* ---------------------------------------------------------------- 32-wide blocks */
/* Q4_0, Q8_0, Q5_0, Q5_1/Q4_1 and MXFP4 store their payload with GGUF's own
 * nibble rule (qs[j] low = element j, high = j + 16), which is 7.5's rule for
 * Sub = 32: the qs bytes are the primary words verbatim. */
static void enc_q4_0(const uint8_t *x, uint32_t *q, uint32_t *d, uint32_t *sc)
{                                                      /* d, qs[16] */
    *d = rd16(x);
    put_pair(q, 0, ld64(x + 2));
    put_pair(q, 2, ld64(x + 10));
}

static void enc_q8_0(const uint8_t *x, uint32_t *q, uint32_t *d, uint32_t *sc)
{                                                      /* d, qs[32] */
    *d = rd16(x);
    for (int w = 0; w < 8; w += 2)
        put_pair(q, w, ld64(x + 2 + 4 * w));
}

static void enc_q5_0(const uint8_t *x, uint32_t *q, uint32_t *d, uint32_t *sc)
{                                                      /* d, qh[4], qs[16] */
    *d = rd16(x);
    put_pair(q, 0, ld64(x + 6));
    put_pair(q, 2, ld64(x + 14));
    q[4 * TILE] = hbits_u32(ld32(x + 2));
}

/* Q5_1 (d, m, qh[4], qs[16]). The d word is lo16 d, hi16 m with its sign bit
 * flipped (7.2). */
static void enc_q5_1(const uint8_t *x, uint32_t *q, uint32_t *d, uint32_t *sc)
{
    *d = (uint32_t)rd16(x) | (uint32_t)(rd16(x + 2) ^ 0x8000u) << 16;
    put_pair(q, 0, ld64(x + 8));
    put_pair(q, 2, ld64(x + 16));
    q[4 * TILE] = hbits_u32(ld32(x + 4));
}

/* Q4_1 (d, m, qs[16]) is stored as Q5_1 whose high bits are all 0. */
static void enc_q4_1(const uint8_t *x, uint32_t *q, uint32_t *d, uint32_t *sc)
{
    *d = (uint32_t)rd16(x) | (uint32_t)(rd16(x + 2) ^ 0x8000u) << 16;
    put_pair(q, 0, ld64(x + 4));
    put_pair(q, 2, ld64(x + 12));
    q[4 * TILE] = 0;
}

/* MXFP4 (e8, qs[16]): a block is all zero when every code is 0 or 8, i.e. no
 * nibble has one of its low 3 bits set: one 0x77 mask per 8 bytes. */
static int mxfp4_zero(const uint8_t *x)
{
    return !((ld64(x + 1) | ld64(x + 9)) & 0x7777777777777777ull);
}

/* Stored byte = E8M0 - 1, or 0 for an all-zero block. A non-zero block with
 * exponent 0, 1 or 255 is refused before encoding (mxfp4_check_row). */
static void enc_mxfp4(const uint8_t *x, uint32_t *q, uint32_t *d, uint32_t *sc)
{
    *d = mxfp4_zero(x) ? 0 : (uint32_t)(x[0] - 1);
    put_pair(q, 0, ld64(x + 1));
    put_pair(q, 2, ld64(x + 9));
}

static int mxfp4_check_row(const uint8_t *x, uint64_t n_blk, uint64_t r, const char *what, jlm_err *err)
{
    for (uint64_t b = 0; b < n_blk; b++, x += 17) {
        uint8_t e8 = x[0];
        if ((e8 == 0 || e8 == 1 || e8 == 255) && !mxfp4_zero(x))
            return jlm_errf(err, JLM_EFORMAT,
                            "%s: MXFP4 block %llu of row %llu: exponent %u is not allowed in a non-zero block "
                            "(allowed 2..254)", what, (unsigned long long)b, (unsigned long long)r, e8);
    }
    return JLM_OK;
}

/* ---------------------------------------------------------------- K-quants */
/* Q4_K / Q5_K six-bit fields sc0, m0, ..., sc7, m7 from GGUF's 12 scale bytes */
static void k4_fields(const uint8_t *scales, uint8_t f6[16])
{
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        if (j < 4) {
            sc = scales[j] & 63;
            m = scales[j + 4] & 63;
        } else {
            sc = (uint8_t)((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
            m = (uint8_t)((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
        }
        f6[2 * j] = sc;
        f6[2 * j + 1] = m;
    }
}

/* 7.3: the 96-bit stream (field f at bit 6f). The pair (sc_j, m_j) is 12
 * bits at bit 12j, so the stream is built in two u64s; only pair 5 (bits
 * 60..71) straddles them. */
static void k_stream(const uint8_t *scales, uint32_t *sc)
{
    uint8_t f6[16];
    k4_fields(scales, f6);
    uint64_t lo = 0, hi = 0;   /* stream bits 0..63, 64..95 */
    for (int j = 0; j < 8; j++) {
        uint64_t pair = f6[2 * j] | (uint64_t)f6[2 * j + 1] << 6;
        int bit = 12 * j;
        if (bit < 64)
            lo |= pair << bit;
        if (bit + 12 > 64)
            hi |= bit < 64 ? pair >> (64 - bit) : pair << (bit - 64);
    }
    sc[0] = (uint32_t)lo;
    sc[TILE] = (uint32_t)(lo >> 32);
    sc[2 * TILE] = (uint32_t)hi;
}

/* Q4_K (d, dmin, scales[12], qs[128]) and Q5_K (..., qh[32], qs[128]). GGUF
 * keeps sub-blocks 2c and 2c+1 in the low and high nibbles of the 32-byte run
 * qs[32c..32c+31]; 7.5 wants per sub-block byte j = code j | code j+16 << 4,
 * which is pair_lo / pair_hi of the run's two 16-byte halves. Q5_K's fifth
 * bit of element l of sub-block s is bit s of qh[l] (hbits_bytes). */
static void enc_k45(const uint8_t *x, uint32_t *q, uint32_t *d, uint32_t *sc, int q5)
{
    const int W = q5 ? 5 : 4;
    const uint8_t *qh = x + 16, *qs = x + (q5 ? 48 : 16);
    *d = ld32(x);   /* lo16 d, hi16 dmin: verbatim */
    k_stream(x + 4, sc);
    for (int c = 0; c < 4; c++) {
        const uint8_t *run = qs + 32 * c;
        uint64_t a0 = ld64(run), a1 = ld64(run + 8), b0 = ld64(run + 16), b1 = ld64(run + 24);
        uint32_t *lo = q + 2 * c * W * TILE, *hi = lo + W * TILE;   /* sub-blocks 2c, 2c+1 */
        put_pair(lo, 0, pair_lo(a0, b0));
        put_pair(lo, 2, pair_lo(a1, b1));
        put_pair(hi, 0, pair_hi(a0, b0));
        put_pair(hi, 2, pair_hi(a1, b1));
        if (q5) {
            lo[4 * TILE] = hbits_bytes(qh, 2 * c, 1, 8);
            hi[4 * TILE] = hbits_bytes(qh, 2 * c + 1, 1, 8);
        }
    }
}

static void enc_q4_k(const uint8_t *x, uint32_t *q, uint32_t *d, uint32_t *sc) { enc_k45(x, q, d, sc, 0); }
static void enc_q5_k(const uint8_t *x, uint32_t *q, uint32_t *d, uint32_t *sc) { enc_k45(x, q, d, sc, 1); }

/* Q6_K (ql[128], qh[64], scales[16] int8, d). 16-wide sub-block s of a
 * super-block (n = s/8, g = (s%8)/2, h = s%2) has its low 4 bits in the
 * low (g < 2) or high nibbles of ql[n*64 + (g&1)*32 + 16h ..+15] and its
 * high 2 bits at bit 2g of qh[n*32 + 16h ..+15]. 7.5 with Sub = 16: byte j =
 * code j | code j+8 << 4 (pair_lo/hi of the 8-byte halves), and the 2 high
 * bits of element 4a+b at byte b, bits 2a (hbits_bytes with 4 groups). The sc
 * bytes are int8 + 128: four at once by ^ 0x80808080. */
static void enc_q6_k(const uint8_t *x, uint32_t *q, uint32_t *d, uint32_t *sc)
{
    const uint8_t *ql = x, *qh = x + 128, *scales = x + 192;
    *d = rd16(x + 208);   /* hi16 stays 0 */
    for (int t = 0; t < 4; t++)
        sc[t * TILE] = ld32(scales + 4 * t) ^ 0x80808080u;
    for (int s = 0; s < 16; s++) {
        int n = s / 8, g = (s % 8) / 2, h = s % 2;
        const uint8_t *lo = ql + n * 64 + (g & 1) * 32 + 16 * h;
        uint64_t a = ld64(lo), b = ld64(lo + 8);
        put_pair(q, 3 * s, g < 2 ? pair_lo(a, b) : pair_hi(a, b));
        q[(3 * s + 2) * TILE] = hbits_bytes(qh + n * 32 + 16 * h, 2 * g, 2, 4);
    }
}

/* Q3_K (hmask[32], qs[64], scales[12], d) at 4 bits: code = low2 | hbit << 2
 * (so code - 4 is ggml's quant). Sub-block s (n = s/8, j = (s%8)/2, h = s%2)
 * takes low2 from bits 2j of qs[n*32 + 16h ..+15] and hbit from bit 4n+j of
 * hmask[16h ..+15]: two masks and a shift per 8 codes, then 7.5's byte j =
 * code j | code j+8 << 4. The 6-bit scale s is (low nibble of byte s for
 * s < 8, high nibble of byte s-8 otherwise) | bits 2(s/4) of byte 8 + s%4,
 * so four sc bytes (one word, s = 4t..4t+3) come from one u32 each. */
static void enc_q3_k(const uint8_t *x, uint32_t *q, uint32_t *d, uint32_t *sc)
{
    const uint8_t *hm = x, *qs = x + 32, *scales = x + 96;
    *d = rd16(x + 108);   /* hi16 stays 0 */
    uint32_t low[4] = {ld32(scales), ld32(scales + 4), ld32(scales) >> 4, ld32(scales + 4) >> 4};
    uint32_t high = ld32(scales + 8);
    for (int t = 0; t < 4; t++)
        sc[t * TILE] = (low[t] & 0x0F0F0F0Fu) | (high >> (2 * t) & 0x03030303u) << 4;
    for (int s = 0; s < 16; s++) {
        int n = s / 8, j = (s % 8) / 2, h = s % 2;
        const uint8_t *qq = qs + n * 32 + 16 * h, *hb = hm + 16 * h;
        uint64_t ca = (ld64(qq) >> (2 * j) & 0x0303030303030303ull) |
                      (ld64(hb) >> (4 * n + j) & 0x0101010101010101ull) << 2;
        uint64_t cb = (ld64(qq + 8) >> (2 * j) & 0x0303030303030303ull) |
                      (ld64(hb + 8) >> (4 * n + j) & 0x0101010101010101ull) << 2;
        put_pair(q, 2 * s, ca | cb << 4);
    }
}
/* ---------------------------------------------------------------- driver */
static int pack_floats(uint32_t g, const void *src, uint64_t k, uint64_t rows, uint8_t *qs)
{
    uint64_t eb = g == GGML_F32 ? 4 : 2;
    memcpy(qs, src, k * rows * eb);
    return JLM_OK;
}

static blk_enc encoder_for(uint32_t g)
{
    switch (g) {
    case GGML_Q4_0:  return enc_q4_0;
    case GGML_Q8_0:  return enc_q8_0;
    case GGML_Q5_0:  return enc_q5_0;
    case GGML_Q5_1:  return enc_q5_1;
    case GGML_Q4_1:  return enc_q4_1;
    case GGML_Q3_K:  return enc_q3_k;
    case GGML_Q6_K:  return enc_q6_k;
    case GGML_Q4_K:
    case GGML_Q2_K:  return enc_q4_k;   /* Q2_K rows are re-quantized to Q4_K first */
    case GGML_Q5_K:  return enc_q5_k;
    case GGML_MXFP4: return enc_mxfp4;
    default:         return NULL;
    }
}

/* The destination of one matrix and the shape of its block words. */
typedef struct dst {
    uint8_t *qs, *d, *sc;   /* the planes, zero-filled by the caller */
    uint64_t rows;
    uint64_t drows;         /* d words per super-block column: ceil(rows / S) (7.2) */
    int      n_q, n_sc, S;  /* payload words W*SuperSub and sc words per block; rows per d word */
} dst;

/* Stores rows r0..r0+nr-1 of block column b. Word i of the column is plane
 * word (b*n + i)*rows + r (7.1, 7.3), so each word's rows are one memcpy;
 * a shared d word holds S consecutive rows' slots, so the d values of
 * consecutive rows are consecutive 16-bit (S = 2) or 8-bit (S = 4) slots
 * starting at byte 4*b*drows + r*4/S (7.2). */
static void store_tile(const dst *o, const tile *tl, uint64_t b, uint64_t r0, uint64_t nr)
{
    for (int i = 0; i < o->n_q; i++)
        memcpy(o->qs + 4 * ((b * (uint64_t)o->n_q + (uint64_t)i) * o->rows + r0), tl->q + i * TILE, 4 * nr);
    for (int i = 0; i < o->n_sc; i++)
        memcpy(o->sc + 4 * ((b * (uint64_t)o->n_sc + (uint64_t)i) * o->rows + r0), tl->sc + i * TILE, 4 * nr);
    uint8_t *dp = o->d + 4 * b * o->drows;
    for (uint64_t j = 0; j < nr; j++) {
        uint32_t v = tl->d[j];
        if (o->S == 1)
            memcpy(dp + 4 * (r0 + j), &v, 4);
        else if (o->S == 2)
            memcpy(dp + 2 * (r0 + j), &v, 2);   /* little-endian: the low 16 bits */
        else
            dp[r0 + j] = (uint8_t)v;
    }
}

/* Q2_K rows: dequantize exactly, re-quantize each 256-block to Q4_K. */
static int requant_row_q2k(const uint8_t *row, uint64_t k, float *f, uint8_t *q4, const char *what,
                           uint64_t r, jlm_err *err)
{
    int rc = jlm_ggml_dequant_row(GGML_Q2_K, row, f, k, err);
    if (rc)
        return rc;
    for (uint64_t i = 0; i < k; i++)
        if (!isfinite(f[i]))
            return jlm_errf(err, JLM_EFORMAT, "%s: Q2_K row %llu element %llu is not finite",
                            what, (unsigned long long)r, (unsigned long long)i);
    return jlm_quant_row(GGML_Q4_K, f, q4, k, err);   /* ggml's quantize_row_q4_K_ref (quantize.c) */
}

int jlm_pack_matrix(uint32_t ggml_type, const void *src, uint64_t k, uint64_t rows,
                    uint8_t jlm_type, uint8_t *qs, uint8_t *d, uint8_t *sc,
                    const char *what, jlm_err *err)
{
    uint8_t want;
    int exact, rc = jlm_pack_stored_type(ggml_type, &want, &exact, err);
    if (rc) {
        jlm_err_prefix(err, rc, "%s", what);   /* returns 0 when err is NULL: keep rc */
        return rc;
    }
    if (want != jlm_type)
        return jlm_errf(err, JLM_EINVAL, "%s: ggml %s is stored as .jlm type %u, not %u", what,
                        jlm_ggml_type_name(ggml_type), want, jlm_type);
    uint32_t be = jlm_ggml_block_elems(ggml_type), bb = jlm_ggml_block_bytes(ggml_type);
    if (k == 0 || rows == 0 || k % be)
        return jlm_errf(err, JLM_EFORMAT, "%s: %s matrix %llu x %llu: row length not a positive multiple of %u",
                        what, jlm_ggml_type_name(ggml_type), (unsigned long long)k,
                        (unsigned long long)rows, be);
    const jlm_type_traits *t = jlm_fmt_type_traits(jlm_type);
    if (t->is_float)
        return pack_floats(ggml_type, src, k, rows, qs);
    blk_enc enc = encoder_for(ggml_type);
    if (!enc)
        return jlm_errf(err, JLM_EUNSUPPORTED, "%s: cannot pack ggml type %u", what, ggml_type);

    const uint8_t *s8 = src;
    uint64_t nsuper = k / ((uint64_t)t->sub * t->super_sub), row_bytes = k / be * bb;
    uint64_t enc_rb = row_bytes, enc_bb = bb;   /* the rows the encoder reads */
    float *f = NULL;
    uint8_t *q4 = NULL;   /* (TILE, nsuper, 144): a tile of Q2_K rows re-quantized */
    if (ggml_type == GGML_Q2_K) {
        f = malloc(k * sizeof(float));
        q4 = malloc(TILE * nsuper * 144);
        if (!f || !q4) {
            free(f);
            free(q4);
            return jlm_errf(err, JLM_ENOMEM, "%s: Q2_K re-quantization buffers (%llu elements)", what,
                            (unsigned long long)k);
        }
        enc_rb = nsuper * 144;
        enc_bb = 144;
    }
    dst o = {.qs = qs, .d = d, .sc = sc, .rows = rows, .drows = (rows + t->d_share - 1) / t->d_share,
             .n_q = t->w * t->super_sub, .n_sc = t->sc_kind == 2 ? 3 : t->sc_kind == 1 ? t->super_sub / 4 : 0,
             .S = t->d_share};
    /* One GGUF block per encoder call: nsuper for the K-quants (and Q2_K's
     * Q4_K re-quantization), k/32 blocks for the 32-wide types. */
    uint64_t n_blk = t->super_sub > 1 ? nsuper : k / be;
    tile tl;
    for (uint64_t r0 = 0; r0 < rows && !rc; r0 += TILE) {
        uint64_t nr = rows - r0 < TILE ? rows - r0 : TILE;
        const uint8_t *tsrc = s8 + r0 * row_bytes;   /* (nr, enc_rb) */
        /* Failures first, row by row, so the error names the first bad
         * block in row order whatever the tiling. */
        for (uint64_t j = 0; j < nr && !rc; j++) {
            if (q4)
                rc = requant_row_q2k(tsrc + j * row_bytes, k, f, q4 + j * enc_rb, what, r0 + j, err);
            else if (ggml_type == GGML_MXFP4)
                rc = mxfp4_check_row(tsrc + j * row_bytes, n_blk, r0 + j, what, err);
        }
        if (q4)
            tsrc = q4;
        for (uint64_t b = 0; b < n_blk && !rc; b++) {   /* hot loop */
            for (uint64_t j = 0; j < nr; j++)
                enc(tsrc + j * enc_rb + b * enc_bb, tl.q + j, tl.d + j, tl.sc + j);
            store_tile(&o, &tl, b, r0, nr);
        }
    }
    free(f);
    free(q4);
    return rc;
}

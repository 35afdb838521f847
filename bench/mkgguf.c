/* mkgguf.c - writes synthetic GGUF v3 files: llama.cpp's llama metadata, a
 * synthetic SPM vocabulary and seeded random weights in one ggml type, for
 * benchmarks and tests that need a model of a given shape without shipping one.
 *
 *   mkgguf PRESET TYPE OUT.gguf [--layers N] [--seed S] [--text-vocab]
 *     PRESET  tiny | tiny-moe | llama-1b | synth-1b | moe-32x4 | moe-1g | fuzz | fuzz-moe
 *     TYPE    F32 | F16 | Q8_0 | Q4_0 | Q4_K
 *
 * The benches #include this file with MKGGUF_NO_MAIN defined and call
 * mkg_preset / mkg_parse_type / mkg_write directly (everything is static, so
 * no symbol leaks into the including program).
 *
 * Weights: uniform in [-0.035, 0.035) (std ~0.02, like the synth-* fixtures),
 * from a splitmix64 stream seeded per tensor (seed, tensor index), so a file
 * is a pure function of (preset, type, layers, seed, --text-vocab). Norm
 * weights are F32 1.
 * Quantizers: Q8_0 and Q4_0 are ggml's reference algorithms (quantize_row_*_ref);
 * Q4_K is a simple valid min/max quantizer (per 32-element sub-block: scale =
 * (max - min(0, min)) / 15, 6-bit scales and mins against the block's largest),
 * not ggml's make_qkx2 search: any valid scales do for a benchmark.
 * Cost: one pass over the elements, ~3-5 ns each on one core; files stream to
 * disk one tensor slice at a time (memory ~ a few MiB).
 */
#include "converter/gguf.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The entry points: static (nothing leaks into an including program) and
 * marked unused, since each includer calls only some of them. */
#define MKG_API static __attribute__((unused))

/* ================================================================ shapes */
typedef struct mkg_shape {
    const char *name;
    uint32_t n_embd, n_ff, n_layer, n_head, n_head_kv, n_vocab, n_ctx;
    uint32_t n_expert, n_expert_used;   /* 0: dense FFN */
    float    rope_base;
    int      tied;                      /* 1: no output.weight (token_embd reused) */
    int      text_vocab;                /* 1: --text-vocab (presets: 0) */
} mkg_shape;

/* llama-1b is Llama-3.2-1B's shape with a 32000 vocab (the real 128256 would
 * add 200 MiB of embedding per file and nothing to the per-block picture). */
static const mkg_shape MKG_PRESETS[] = {
    {"tiny",     256, 512, 2, 4, 2, 512, 512, 0, 0, 10000.0f, 0, 0},
    {"tiny-moe", 256, 256, 2, 4, 2, 512, 512, 4, 2, 10000.0f, 0, 0},
    {"llama-1b", 2048, 8192, 16, 32, 8, 32000, 4096, 0, 0, 500000.0f, 1, 0},
    /* the same blocks with a 512-token vocab and a separate output (975 M
     * parameters): bench/vs-llama.sh's model, written in F16 and quantized by
     * llama-quantize so that both engines read the same GGUFs */
    {"synth-1b", 2048, 8192, 16, 32, 8, 512, 4096, 0, 0, 500000.0f, 0, 0},
    {"moe-32x4", 1024, 512, 8, 16, 4, 32000, 4096, 32, 4, 10000.0f, 0, 0},
    /* issue 42's larger-than-memory MoE: 16 blocks of 32 experts of FFN
     * 1024, 4 used, stories260K's 512 vocab, context 2048 (1.0 GB at Q4_K_M) */
    {"moe-1g",   1024, 1024, 16, 16, 4, 512, 2048, 32, 4, 500000.0f, 0, 0},
    /* fuzz seeds (tests/fuzz/mkseeds.c): the smallest files the whole path takes */
    {"fuzz",     32, 64, 1, 2, 1, 288, 64, 0, 0, 10000.0f, 0, 0},
    {"fuzz-moe", 32, 32, 1, 2, 1, 288, 64, 4, 2, 10000.0f, 1, 0},
};

MKG_API int mkg_preset(const char *name, mkg_shape *out)
{
    for (size_t i = 0; i < sizeof MKG_PRESETS / sizeof MKG_PRESETS[0]; i++)
        if (!strcmp(MKG_PRESETS[i].name, name)) {
            *out = MKG_PRESETS[i];
            return 0;
        }
    return -1;
}

MKG_API int mkg_parse_type(const char *s, uint32_t *type)
{
    static const struct { const char *n; uint32_t t; } T[] = {
        {"F32", GGML_F32}, {"F16", GGML_F16}, {"Q8_0", GGML_Q8_0}, {"Q4_0", GGML_Q4_0}, {"Q4_K", GGML_Q4_K}};
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        if (!strcmp(T[i].n, s)) {
            *type = T[i].t;
            return 0;
        }
    return -1;
}

/* ================================================================ random */
static uint64_t mkg_splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* hot loop: one call per weight */
static void mkg_fill(uint64_t *s, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = ((float)(mkg_splitmix(s) >> 40) * (1.0f / 16777216.0f) - 0.5f) * 0.07f;
}

/* ================================================================ quantizers */
static void mkg_put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

/* ggml quantize_row_q8_0_ref: d = amax/127, q = round(x/d); 34 bytes a block */
static void mkg_q8_0(const float *x, uint8_t *y, size_t n)
{
    for (size_t b = 0; b < n / 32; b++, x += 32, y += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        mkg_put16(y, jlm_f32_to_f16(d));
        for (int j = 0; j < 32; j++)
            y[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
    }
}

/* ggml quantize_row_q4_0_ref: d = max/-8 (signed max), q = min(15, x/d + 8.5) */
static void mkg_q4_0(const float *x, uint8_t *y, size_t n)
{
    for (size_t b = 0; b < n / 32; b++, x += 32, y += 18) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        float d = max / -8.0f, id = d ? 1.0f / d : 0.0f;
        mkg_put16(y, jlm_f32_to_f16(d));
        for (int j = 0; j < 16; j++) {
            int a = (int)(int8_t)(x[j] * id + 8.5f), c = (int)(int8_t)(x[16 + j] * id + 8.5f);
            a = a > 15 ? 15 : a;
            c = c > 15 ? 15 : c;
            y[2 + j] = (uint8_t)(a | (c << 4));
        }
    }
}

static int mkg_nearest(float v, int lo, int hi)
{
    int q = (int)lrintf(v);
    return q < lo ? lo : q > hi ? hi : q;
}

/* One Q4_K block (256 values -> 144 bytes: d, dmin, scales[12], qs[128]),
 * laid out so ggml's dequantize_row_q4_K gives x ~ d*sc*q - dmin*m. */
static void mkg_q4_k_block(const float *x, uint8_t *y)
{
    float scale[8], minv[8], smax = 0.0f, mmax = 0.0f;
    for (int j = 0; j < 8; j++) {
        float lo = 0.0f, hi = -INFINITY;
        for (int l = 0; l < 32; l++) {
            lo = fminf(lo, x[32 * j + l]);
            hi = fmaxf(hi, x[32 * j + l]);
        }
        scale[j] = (hi - lo) / 15.0f;
        minv[j] = -lo;
        smax = fmaxf(smax, scale[j]);
        mmax = fmaxf(mmax, minv[j]);
    }
    uint16_t dh = jlm_f32_to_f16(smax / 63.0f), mh = jlm_f32_to_f16(mmax / 63.0f);
    float d = jlm_f16_to_f32(dh), dmin = jlm_f16_to_f32(mh);
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)(d > 0.0f ? mkg_nearest(scale[j] / d, 0, 63) : 0);
        lm[j] = (uint8_t)(dmin > 0.0f ? mkg_nearest(minv[j] / dmin, 0, 63) : 0);
    }
    mkg_put16(y, dh);
    mkg_put16(y + 2, mh);
    uint8_t *sc = y + 4, *qs = y + 16;
    for (int j = 0; j < 4; j++) {   /* ggml's 6-bit packing (get_scale_min_k4 inverse) */
        sc[j] = (uint8_t)((ls[j] & 63) | ((ls[j + 4] >> 4) << 6));
        sc[j + 4] = (uint8_t)((lm[j] & 63) | ((lm[j + 4] >> 4) << 6));
        sc[j + 8] = (uint8_t)((ls[j + 4] & 15) | ((lm[j + 4] & 15) << 4));
    }
    for (int c = 0; c < 4; c++)     /* 64 values a chunk: sub-block 2c low nibble, 2c+1 high */
        for (int l = 0; l < 32; l++) {
            int q[2];
            for (int h = 0; h < 2; h++) {
                int j = 2 * c + h;
                float s = d * ls[j], m = dmin * lm[j];
                q[h] = s > 0.0f ? mkg_nearest((x[32 * j + l] + m) / s, 0, 15) : 0;
            }
            qs[32 * c + l] = (uint8_t)(q[0] | (q[1] << 4));
        }
}

static void mkg_q4_k(const float *x, uint8_t *y, size_t n)
{
    for (size_t b = 0; b < n / 256; b++)
        mkg_q4_k_block(x + 256 * b, y + 144 * b);
}

/* Encodes n floats (n a multiple of the type's block) into y. */
static void mkg_encode(uint32_t type, const float *x, uint8_t *y, size_t n)
{
    switch (type) {
    case GGML_F32: memcpy(y, x, n * 4); break;
    case GGML_F16:
        for (size_t i = 0; i < n; i++)
            mkg_put16(y + 2 * i, jlm_f32_to_f16(x[i]));
        break;
    case GGML_Q8_0: mkg_q8_0(x, y, n); break;
    case GGML_Q4_0: mkg_q4_0(x, y, n); break;
    default: mkg_q4_k(x, y, n); break;
    }
}

/* ================================================================ tensor list */
typedef struct mkg_tensor {
    char     name[64];
    uint32_t n_dims, type;
    uint64_t ne[3];
    int      norm;         /* 1: all ones */
    uint64_t off, n_bytes; /* relative to the data section */
} mkg_tensor;

typedef struct mkg_list { mkg_tensor *t; uint32_t n, cap; } mkg_list;

static int mkg_add(mkg_list *L, const char *name, uint32_t type, int norm, uint32_t n_dims, uint64_t ne0,
                   uint64_t ne1, uint64_t ne2)
{
    if (L->n == L->cap) {
        uint32_t cap = L->cap ? 2 * L->cap : 64;
        mkg_tensor *t = realloc(L->t, cap * sizeof *t);
        if (!t)
            return -1;
        L->t = t;
        L->cap = cap;
    }
    mkg_tensor *t = &L->t[L->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    t->type = type;
    t->norm = norm;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    uint64_t elems = ne0 * ne1 * ne2;
    t->n_bytes = elems / jlm_ggml_block_elems(type) * jlm_ggml_block_bytes(type);
    return 0;
}

/* llama.cpp's tensor names and shapes (ggml ne order: ne[0] = row length). */
static int mkg_tensors(const mkg_shape *s, uint32_t type, mkg_list *L)
{
    uint64_t E = s->n_embd, F = s->n_ff, KV = (uint64_t)s->n_embd / s->n_head * s->n_head_kv, X = s->n_expert;
    int rc = mkg_add(L, "token_embd.weight", type, 0, 2, E, s->n_vocab, 1);
    rc |= mkg_add(L, "output_norm.weight", GGML_F32, 1, 1, E, 1, 1);
    if (!s->tied)
        rc |= mkg_add(L, "output.weight", type, 0, 2, E, s->n_vocab, 1);
    for (uint32_t b = 0; b < s->n_layer && !rc; b++) {
        char n[64];
#define T(suf, ty, norm, nd, a, c, d) (snprintf(n, sizeof n, "blk.%u." suf, b), mkg_add(L, n, ty, norm, nd, a, c, d))
        rc |= T("attn_norm.weight", GGML_F32, 1, 1, E, 1, 1);
        rc |= T("attn_q.weight", type, 0, 2, E, E, 1);
        rc |= T("attn_k.weight", type, 0, 2, E, KV, 1);
        rc |= T("attn_v.weight", type, 0, 2, E, KV, 1);
        rc |= T("attn_output.weight", type, 0, 2, E, E, 1);
        rc |= T("ffn_norm.weight", GGML_F32, 1, 1, E, 1, 1);
        if (X) {
            rc |= T("ffn_gate_inp.weight", GGML_F32, 0, 2, E, X, 1);
            rc |= T("ffn_gate_exps.weight", type, 0, 3, E, F, X);
            rc |= T("ffn_up_exps.weight", type, 0, 3, E, F, X);
            rc |= T("ffn_down_exps.weight", type, 0, 3, F, E, X);
        } else {
            rc |= T("ffn_gate.weight", type, 0, 2, E, F, 1);
            rc |= T("ffn_up.weight", type, 0, 2, E, F, 1);
            rc |= T("ffn_down.weight", type, 0, 2, F, E, 1);
        }
#undef T
    }
    return rc;
}

/* ================================================================ GGUF writer */
typedef struct mkg_out { FILE *f; int bad; } mkg_out;

static void mkg_bytes(mkg_out *o, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, o->f) != n)
        o->bad = 1;
}
static void mkg_u32(mkg_out *o, uint32_t v) { mkg_bytes(o, &v, 4); }
static void mkg_u64(mkg_out *o, uint64_t v) { mkg_bytes(o, &v, 8); }
static void mkg_str(mkg_out *o, const char *s) { mkg_u64(o, strlen(s)); mkg_bytes(o, s, strlen(s)); }
static void mkg_kv_u32(mkg_out *o, const char *k, uint32_t v) { mkg_str(o, k); mkg_u32(o, GGUF_T_U32); mkg_u32(o, v); }
static void mkg_kv_f32(mkg_out *o, const char *k, float v) { mkg_str(o, k); mkg_u32(o, GGUF_T_F32); mkg_bytes(o, &v, 4); }
static void mkg_kv_str(mkg_out *o, const char *k, const char *v) { mkg_str(o, k); mkg_u32(o, GGUF_T_STRING); mkg_str(o, v); }

/* Token i of the synthetic SPM vocab: <unk> <s> </s>, <0x00>..<0xFF>, fillers.
 * text: every id decodes to valid UTF-8 on its own (--text-vocab): the bytes
 * 0x80..0xFF are normal tokens "{0x80}".."{0xFF}" and the first filler is
 * U+2581 alone (SPM's space, which ASCII text then needs no byte for). */
static void mkg_token(uint32_t i, int text, char *buf, size_t n)
{
    if (i < 3)
        snprintf(buf, n, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
    else if (text && i >= 3 + 0x80 && i < 259)
        snprintf(buf, n, "{0x%02X}", i - 3);
    else if (text && i == 259)
        snprintf(buf, n, "\xe2\x96\x81");
    else if (i < 259)
        snprintf(buf, n, "<0x%02X>", i - 3);
    else
        snprintf(buf, n, "\xe2\x96\x81t%u", i - 259);   /* U+2581 then a unique tail */
}

static void mkg_vocab(mkg_out *o, uint32_t n_vocab, int text)
{
    char tok[32];
    mkg_kv_str(o, "tokenizer.ggml.model", "llama");
    mkg_str(o, "tokenizer.ggml.tokens");
    mkg_u32(o, GGUF_T_ARRAY);
    mkg_u32(o, GGUF_T_STRING);
    mkg_u64(o, n_vocab);
    for (uint32_t i = 0; i < n_vocab; i++) {
        mkg_token(i, text, tok, sizeof tok);
        mkg_str(o, tok);
    }
    mkg_str(o, "tokenizer.ggml.scores");
    mkg_u32(o, GGUF_T_ARRAY);
    mkg_u32(o, GGUF_T_F32);
    mkg_u64(o, n_vocab);
    for (uint32_t i = 0; i < n_vocab; i++) {
        float sc = i < 259 ? 0.0f : -(float)(i - 259);
        mkg_bytes(o, &sc, 4);
    }
    mkg_str(o, "tokenizer.ggml.token_type");
    mkg_u32(o, GGUF_T_ARRAY);
    mkg_u32(o, GGUF_T_I32);
    mkg_u64(o, n_vocab);
    for (uint32_t i = 0; i < n_vocab; i++)   /* llama.cpp: 1 normal, 2 unknown, 3 control, 6 byte */
        mkg_u32(o, i == 0 ? 2 : i < 3 ? 3 : i < 3 + 0x80 || (i < 259 && !text) ? 6 : 1);
    mkg_kv_u32(o, "tokenizer.ggml.unknown_token_id", 0);
    mkg_kv_u32(o, "tokenizer.ggml.bos_token_id", 1);
    mkg_kv_u32(o, "tokenizer.ggml.eos_token_id", 2);
}

static uint64_t mkg_n_kv(const mkg_shape *s) { return 12 + (s->n_expert ? 2 : 0) + 7; }

static void mkg_meta(mkg_out *o, const mkg_shape *s)
{
    mkg_kv_str(o, "general.architecture", "llama");
    mkg_kv_str(o, "general.name", s->name);
    mkg_kv_u32(o, "llama.block_count", s->n_layer);
    mkg_kv_u32(o, "llama.context_length", s->n_ctx);
    mkg_kv_u32(o, "llama.embedding_length", s->n_embd);
    mkg_kv_u32(o, "llama.feed_forward_length", s->n_ff);
    mkg_kv_u32(o, "llama.attention.head_count", s->n_head);
    mkg_kv_u32(o, "llama.attention.head_count_kv", s->n_head_kv);
    mkg_kv_u32(o, "llama.rope.dimension_count", s->n_embd / s->n_head);
    mkg_kv_f32(o, "llama.rope.freq_base", s->rope_base);
    mkg_kv_f32(o, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    mkg_kv_u32(o, "llama.vocab_size", s->n_vocab);
    if (s->n_expert) {
        mkg_kv_u32(o, "llama.expert_count", s->n_expert);
        mkg_kv_u32(o, "llama.expert_used_count", s->n_expert_used);
    }
    mkg_vocab(o, s->n_vocab, s->text_vocab);   /* 7 keys */
}

static void mkg_pad(mkg_out *o, uint64_t *pos, uint64_t align)
{
    static const uint8_t z[32];
    uint64_t n = (align - *pos % align) % align;
    mkg_bytes(o, z, n);
    *pos += n;
}

/* Streams one tensor's data: rows generated and encoded a slice at a time. */
static int mkg_data(mkg_out *o, const mkg_tensor *t, uint64_t seed, uint32_t idx)
{
    uint64_t row = t->ne[0], rows = t->ne[1] * t->ne[2], per = 65536 / row ? 65536 / row : 1;
    uint64_t row_bytes = row / jlm_ggml_block_elems(t->type) * jlm_ggml_block_bytes(t->type);
    float *x = malloc(per * row * sizeof *x);
    uint8_t *y = malloc(per * row_bytes);
    uint64_t st = seed * 0x100000001b3ull ^ (idx + 1) * 0x9e3779b97f4a7c15ull;
    if (!x || !y) {
        free(x);
        free(y);
        return -1;
    }
    for (uint64_t r = 0; r < rows && !o->bad; r += per) {
        uint64_t k = rows - r < per ? rows - r : per;
        if (t->norm) {
            for (uint64_t i = 0; i < k * row; i++)
                x[i] = 1.0f;
        } else {
            mkg_fill(&st, x, k * row);
            /* Routers 25x wider (std ~0.5): with std-0.02 routers every token of a
             * random model picks nearly the same experts, which no trained
             * model (load-balanced) does and which leaves an expert cache idle. */
            if (strstr(t->name, "ffn_gate_inp"))
                for (uint64_t i = 0; i < k * row; i++)
                    x[i] *= 25.0f;
        }
        mkg_encode(t->type, x, y, k * row);
        mkg_bytes(o, y, k * row_bytes);
    }
    free(x);
    free(y);
    return o->bad ? -1 : 0;
}

/* Writes the model to path. 0, or -1 with a message in msg (the file may be
 * left partial then). n_layer 0 keeps the preset's count. */
MKG_API int mkg_write(const char *path, const mkg_shape *shape, uint32_t type, uint32_t n_layer, uint64_t seed,
                     char *msg, size_t msg_len)
{
    mkg_shape s = *shape;
    if (n_layer)
        s.n_layer = n_layer;
    uint32_t be = jlm_ggml_block_elems(type);
    if (!be || s.n_embd % be || s.n_ff % be) {
        snprintf(msg, msg_len, "%.400s: n_embd %u / n_ff %u not a multiple of the %u-element block", path, s.n_embd,
                 s.n_ff, be);
        return -1;
    }
    mkg_list L = {0};
    if (mkg_tensors(&s, type, &L)) {
        free(L.t);
        snprintf(msg, msg_len, "%.400s: out of memory", path);
        return -1;
    }
    mkg_out o = {fopen(path, "wb"), 0};
    if (!o.f) {
        free(L.t);
        snprintf(msg, msg_len, "%.400s: cannot create", path);
        return -1;
    }
    uint64_t off = 0;
    for (uint32_t i = 0; i < L.n; i++) {
        L.t[i].off = off;
        off += (L.t[i].n_bytes + 31) / 32 * 32;
    }
    mkg_bytes(&o, "GGUF", 4);
    mkg_u32(&o, 3);
    mkg_u64(&o, L.n);
    mkg_u64(&o, mkg_n_kv(&s));
    mkg_meta(&o, &s);
    for (uint32_t i = 0; i < L.n; i++) {
        mkg_str(&o, L.t[i].name);
        mkg_u32(&o, L.t[i].n_dims);
        for (uint32_t d = 0; d < L.t[i].n_dims; d++)
            mkg_u64(&o, L.t[i].ne[d]);
        mkg_u32(&o, L.t[i].type);
        mkg_u64(&o, L.t[i].off);
    }
    long hl = ftell(o.f);
    uint64_t pos = hl < 0 ? 0 : (uint64_t)hl;
    if (hl < 0)
        o.bad = 1;
    mkg_pad(&o, &pos, 32);
    for (uint32_t i = 0; i < L.n && !o.bad; i++) {
        if (mkg_data(&o, &L.t[i], seed, i))
            o.bad = 1;
        pos += L.t[i].n_bytes;
        mkg_pad(&o, &pos, 32);
    }
    free(L.t);
    if (fclose(o.f) || o.bad) {
        snprintf(msg, msg_len, "%.400s: write failed (disk full?)", path);
        return -1;
    }
    return 0;
}

#ifndef MKGGUF_NO_MAIN
int main(int argc, char **argv)
{
    static const char usage[] =
        "usage: mkgguf PRESET TYPE OUT.gguf [--layers N] [--seed S] [--text-vocab]\n"
        "  PRESET  tiny | tiny-moe | llama-1b (Llama-3.2-1B shape, vocab 32000) | synth-1b (vocab 512) | moe-32x4 | moe-1g\n"
        "  TYPE    F32 | F16 | Q8_0 | Q4_0 | Q4_K\n"
        "  --text-vocab  no lone non-ASCII byte tokens: every token decodes to valid UTF-8\n"
        "(a tool, not a benchmark: `make bench` runs it without arguments, which prints this)\n";
    if (argc < 4) {
        fputs(usage, stdout);
        return 0;
    }
    mkg_shape s = {0};
    uint32_t type, layers = 0;
    uint64_t seed = 1;
    if (mkg_preset(argv[1], &s) || mkg_parse_type(argv[2], &type)) {
        fprintf(stderr, "mkgguf: unknown preset '%s' or type '%s'\n%s", argv[1], argv[2], usage);
        return 2;
    }
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--text-vocab")) s.text_vocab = 1;
        else {
            fprintf(stderr, "mkgguf: unknown option '%s'\n%s", argv[i], usage);
            return 2;
        }
    }
    char msg[512];
    if (mkg_write(argv[3], &s, type, layers, seed, msg, sizeof msg)) {
        fprintf(stderr, "mkgguf: %s\n", msg);
        return 1;
    }
    return 0;
}
#endif

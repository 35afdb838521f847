/* codec.c - encoders and bounded decoders of the container's sections
 * (jlm-format.md 3 and 4): header, config, vision, vocab, tensor table,
 * fingerprint; plus the byte buffer and arena they use.
 *
 * Decoders read through a cursor that carries an end pointer; every length is
 * checked against the bytes left before anything is allocated (style rule 6).
 * They refuse, never repair. */
#include "format/jlm_format.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ================================================================ jlm_buf */
void jlm_buf_free(jlm_buf *b)
{
    if (!b)
        return;
    free(b->p);
    memset(b, 0, sizeof *b);
}

static void buf_put(jlm_buf *b, const void *src, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void put_u8(jlm_buf *b, uint8_t v)   { buf_put(b, &v, 1); }
static void put_u16(jlm_buf *b, uint16_t v) { uint8_t x[2] = {v, v >> 8}; buf_put(b, x, 2); }
static void put_u32(jlm_buf *b, uint32_t v)
{
    uint8_t x[4] = {v, v >> 8, v >> 16, v >> 24};
    buf_put(b, x, 4);
}
static void put_u64(jlm_buf *b, uint64_t v) { put_u32(b, (uint32_t)v); put_u32(b, (uint32_t)(v >> 32)); }
static void put_i32(jlm_buf *b, int32_t v)  { put_u32(b, (uint32_t)v); }
static void put_f32(jlm_buf *b, float f)    { uint32_t u; memcpy(&u, &f, 4); put_u32(b, u); }
static void put_str(jlm_buf *b, jlm_str s)  { put_u32(b, s.len); buf_put(b, s.s, s.len); }
static void put_str16(jlm_buf *b, jlm_str s)
{
    uint16_t n = s.len > 0xFFFF ? 0xFFFF : (uint16_t)s.len;
    put_u16(b, n);
    buf_put(b, s.s, n);
}

/* ================================================================ arena */
struct jlm_arena {
    struct arena_blk *head;
};
struct arena_blk {
    struct arena_blk *next;
    size_t used, cap;
    _Alignas(16) uint8_t data[];
};

jlm_arena *jlm_arena_new(void) { return calloc(1, sizeof(jlm_arena)); }

void jlm_arena_free(jlm_arena *a)
{
    if (!a)
        return;
    for (struct arena_blk *b = a->head, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    free(a);
}

void *jlm_arena_alloc(jlm_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    struct arena_blk *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > (1u << 16) ? n : (1u << 16);
        b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->used = 0;
        b->cap = cap;
        b->next = a->head;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

/* ================================================================ decode cursor */
typedef struct cur {
    const uint8_t *p, *end;
    const char *what;      /* file name for messages */
    const char *section;   /* "config record", ... */
    const uint8_t *base;
    jlm_err *err;
    int rc;                /* first error, sticky */
} cur;

static int cur_fail(cur *c, const char *field, size_t need)
{
    if (!c->rc)
        c->rc = jlm_errf(c->err, JLM_EFORMAT, "%s: %s: %s at byte %zu needs %zu bytes, %zu left",
                         c->what, c->section, field, (size_t)(c->p - c->base), need,
                         (size_t)(c->end - c->p));
    c->p = c->end;
    return c->rc;
}

static size_t left(const cur *c) { return (size_t)(c->end - c->p); }

static const uint8_t *take(cur *c, size_t n, const char *field)
{
    if (c->rc)
        return NULL;
    if (left(c) < n) {
        cur_fail(c, field, n);
        return NULL;
    }
    const uint8_t *p = c->p;
    c->p += n;
    return p;
}

static uint8_t get_u8(cur *c, const char *f)  { const uint8_t *p = take(c, 1, f); return p ? p[0] : 0; }
static uint16_t get_u16(cur *c, const char *f) { const uint8_t *p = take(c, 2, f); return p ? (uint16_t)(p[0] | p[1] << 8) : 0; }
static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t rd64(const uint8_t *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static uint32_t get_u32(cur *c, const char *f) { const uint8_t *p = take(c, 4, f); return p ? rd32(p) : 0; }
static uint64_t get_u64(cur *c, const char *f) { const uint8_t *p = take(c, 8, f); return p ? rd64(p) : 0; }
static int32_t get_i32(cur *c, const char *f)  { return (int32_t)get_u32(c, f); }
static float get_f32(cur *c, const char *f)    { uint32_t u = get_u32(c, f); float x; memcpy(&x, &u, 4); return x; }
static uint8_t get_bool(cur *c, const char *f)
{
    uint8_t v = get_u8(c, f);
    if (!c->rc && v > 1)
        c->rc = jlm_errf(c->err, JLM_EFORMAT, "%s: %s: %s is %u, not a bool", c->what, c->section, f, v);
    return v;
}

/* A string of n bytes copied into the arena, NUL-terminated. */
static jlm_str get_bytes(cur *c, jlm_arena *a, size_t n, const char *f)
{
    jlm_str s = {"", 0};
    const uint8_t *p = take(c, n, f);
    if (!p)
        return s;
    char *d = jlm_arena_alloc(a, n + 1);
    if (!d) {
        c->rc = jlm_errf(c->err, JLM_ENOMEM, "%s: %s: out of memory", c->what, c->section);
        return s;
    }
    memcpy(d, p, n);
    s.s = d;
    s.len = (uint32_t)n;
    return s;
}
static jlm_str get_str(cur *c, jlm_arena *a, const char *f) { uint32_t n = get_u32(c, f); return get_bytes(c, a, n, f); }
static jlm_str get_str16(cur *c, jlm_arena *a, const char *f) { uint16_t n = get_u16(c, f); return get_bytes(c, a, n, f); }

/* A list count whose elements take at least min_elem bytes each: checked
 * against the bytes left before the caller allocates. */
static uint32_t get_count(cur *c, size_t min_elem, const char *f)
{
    uint32_t n = get_u32(c, f);
    if (!c->rc && min_elem && (uint64_t)n * min_elem > left(c)) {
        c->rc = jlm_errf(c->err, JLM_EFORMAT, "%s: %s: %s count %u needs at least %llu bytes, %zu left",
                         c->what, c->section, f, n, (unsigned long long)n * min_elem, left(c));
        return 0;
    }
    return n;
}

static void *arr_alloc(cur *c, jlm_arena *a, size_t n, size_t elem)
{
    if (c->rc)
        return NULL;
    void *p = jlm_arena_alloc(a, n * elem);
    if (!p)
        c->rc = jlm_errf(c->err, JLM_ENOMEM, "%s: %s: out of memory", c->what, c->section);
    return p;
}

/* ================================================================ header (3) */
void jlm_fmt_header_encode(const jlm_header *h, uint8_t out[JLM_HEADER_LEN])
{
    jlm_buf b = {0};
    uint8_t tmp[JLM_HEADER_LEN];
    b.p = tmp; b.cap = sizeof tmp;   /* never grows: exactly 192 bytes */
    buf_put(&b, JLM_MAGIC, 8);
    put_u32(&b, h->version); put_u32(&b, 0);
    put_u64(&b, h->page_size);
    put_u32(&b, h->n_blocks); put_u32(&b, h->n_tensors);
    put_u64(&b, h->cfg_off); put_u64(&b, h->cfg_len);
    put_u64(&b, h->tab_off); put_u64(&b, h->tab_len);
    put_u64(&b, h->data_off);
    put_u64(&b, h->dense_off); put_u64(&b, h->dense_len);
    put_u64(&b, h->fp_off); put_u64(&b, h->fp_len);
    put_u64(&b, h->voc_off); put_u64(&b, h->voc_len);
    put_u64(&b, h->vis_off); put_u64(&b, h->vis_len);
    put_u64(&b, h->vis_data_off); put_u64(&b, h->vis_page_size);
    put_u32(&b, h->n_vis_blocks); put_u32(&b, 0);
    put_u64(&b, h->chunk);
    put_u32(&b, h->stream_groups); put_u32(&b, h->n_exp_pages);
    put_u64(&b, h->exp_data_off); put_u64(&b, h->exp_page_size);
    memcpy(out, tmp, JLM_HEADER_LEN);
}

int jlm_fmt_header_decode(const uint8_t *buf, size_t len, jlm_header *out, jlm_err *err)
{
    if (len < 8 || memcmp(buf, JLM_MAGIC, 8) != 0)
        return jlm_errf(err, JLM_EFORMAT, "not a jlm container (bad magic)");
    if (len < 12)
        return jlm_errf(err, JLM_EFORMAT, "truncated header: %zu of %u bytes", len, JLM_HEADER_LEN);
    uint32_t ver = rd32(buf + 8);
    if (ver != JLM_VERSION)
        return jlm_errf(err, JLM_EVERSION, "container version %u, this build reads %u: rebuild it with `jlm convert`",
                        ver, JLM_VERSION);
    if (len < JLM_HEADER_LEN)
        return jlm_errf(err, JLM_EFORMAT, "truncated header: %zu of %u bytes", len, JLM_HEADER_LEN);
    const uint8_t *p = buf;
    jlm_header h = {0};
    h.version = ver;
    h.page_size = rd64(p + 16);
    h.n_blocks = rd32(p + 24); h.n_tensors = rd32(p + 28);
    h.cfg_off = rd64(p + 32); h.cfg_len = rd64(p + 40);
    h.tab_off = rd64(p + 48); h.tab_len = rd64(p + 56);
    h.data_off = rd64(p + 64);
    h.dense_off = rd64(p + 72); h.dense_len = rd64(p + 80);
    h.fp_off = rd64(p + 88); h.fp_len = rd64(p + 96);
    h.voc_off = rd64(p + 104); h.voc_len = rd64(p + 112);
    h.vis_off = rd64(p + 120); h.vis_len = rd64(p + 128);
    h.vis_data_off = rd64(p + 136); h.vis_page_size = rd64(p + 144);
    h.n_vis_blocks = rd32(p + 152);
    h.chunk = rd64(p + 160);
    h.stream_groups = rd32(p + 168); h.n_exp_pages = rd32(p + 172);
    h.exp_data_off = rd64(p + 176); h.exp_page_size = rd64(p + 184);
    if (rd32(p + 12) != 0 || rd32(p + 156) != 0)
        return jlm_errf(err, JLM_EFORMAT, "reserved header field is not 0");
    *out = h;
    return JLM_OK;
}

static int is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

static int span_ok(uint64_t off, uint64_t len, uint64_t size)
{
    return off <= size && len <= size - off;
}

/* A page array [off, off + n*size) inside the file, aligned, no overflow. */
static int check_array(const char *name, uint64_t off, uint64_t n, uint64_t size,
                       uint64_t file_size, jlm_err *err)
{
    if (n == 0)
        return JLM_OK;
    uint64_t total;
    if (off % JLM_ALIGN)
        return jlm_errf(err, JLM_EFORMAT, "%s page array offset %llu is not 4096-aligned", name, (unsigned long long)off);
    if (size == 0 || size % JLM_ALIGN)
        return jlm_errf(err, JLM_EFORMAT, "%s page size %llu is not a nonzero multiple of 4096", name, (unsigned long long)size);
    if (__builtin_mul_overflow(n, size, &total) || !span_ok(off, total, file_size))
        return jlm_errf(err, JLM_EFORMAT, "%s page array (%llu pages of %llu bytes at %llu) runs past the end of the file (%llu bytes)",
                        name, (unsigned long long)n, (unsigned long long)size, (unsigned long long)off,
                        (unsigned long long)file_size);
    return JLM_OK;
}

int jlm_fmt_header_validate(const jlm_header *h, uint64_t fs, jlm_err *err)
{
    if (h->page_size == 0 || h->page_size % JLM_ALIGN)
        return jlm_errf(err, JLM_EFORMAT, "page size %llu, expected a nonzero multiple of 4096", (unsigned long long)h->page_size);
    uint64_t largest = h->page_size;
    if (h->n_vis_blocks && h->vis_page_size > largest) largest = h->vis_page_size;
    if (h->n_exp_pages && h->exp_page_size > largest) largest = h->exp_page_size;
    if (!is_pow2(h->chunk) || h->chunk < JLM_ALIGN || h->chunk > largest)
        return jlm_errf(err, JLM_EFORMAT, "chunk %llu, expected a power of two in [4096, %llu]",
                        (unsigned long long)h->chunk, (unsigned long long)largest);
    if (h->data_off % JLM_ALIGN)
        return jlm_errf(err, JLM_EFORMAT, "data offset %llu is not 4096-aligned", (unsigned long long)h->data_off);
    struct { const char *n; uint64_t off, len; } sec[] = {
        {"config record", h->cfg_off, h->cfg_len}, {"tensor table", h->tab_off, h->tab_len},
        {"dense region", h->dense_off, h->dense_len}, {"fingerprint", h->fp_off, h->fp_len},
        {"vocab record", h->voc_off, h->voc_len}, {"vision record", h->vis_off, h->vis_len},
    };
    for (size_t i = 0; i < sizeof sec / sizeof sec[0]; i++)
        if (!span_ok(sec[i].off, sec[i].len, fs))
            return jlm_errf(err, JLM_EFORMAT, "%s [%llu, +%llu) runs past the end of the file (%llu bytes)",
                            sec[i].n, (unsigned long long)sec[i].off, (unsigned long long)sec[i].len,
                            (unsigned long long)fs);
    /* File order of section 2: packed sections back to back, then aligned regions. */
    if (h->cfg_off != JLM_HEADER_LEN || h->vis_off != h->cfg_off + h->cfg_len ||
        h->voc_off != h->vis_off + h->vis_len || h->tab_off != h->voc_off + h->voc_len ||
        h->fp_off != h->tab_off + h->tab_len)
        return jlm_errf(err, JLM_EFORMAT, "sections are not in the order config, vision, vocab, table, fingerprint from byte 192");
    if (h->dense_off != jlm_align_up(h->fp_off + h->fp_len) || h->dense_len % JLM_ALIGN ||
        h->data_off != jlm_align_up(h->dense_off + h->dense_len))
        return jlm_errf(err, JLM_EFORMAT, "dense region [%llu, +%llu) or data offset %llu not where section 2 puts them",
                        (unsigned long long)h->dense_off, (unsigned long long)h->dense_len,
                        (unsigned long long)h->data_off);
    int rc;
    if ((rc = check_array("text", h->data_off, h->n_blocks, h->page_size, fs, err)) ||
        (rc = check_array("vision", h->vis_data_off, h->n_vis_blocks, h->vis_page_size, fs, err)) ||
        (rc = check_array("expert", h->exp_data_off, h->n_exp_pages, h->exp_page_size, fs, err)))
        return rc;
    if (h->data_off > fs)
        return jlm_errf(err, JLM_EFORMAT, "data offset %llu past the end of the file (%llu bytes)",
                        (unsigned long long)h->data_off, (unsigned long long)fs);
    if (h->n_exp_pages == 0 && (h->exp_data_off != 0 || h->exp_page_size != 0))
        return jlm_errf(err, JLM_EFORMAT, "expert page array fields set without expert pages");
    if (h->stream_groups == 0)
        return jlm_errf(err, JLM_EFORMAT, "stream groups is 0");
    return JLM_OK;
}

/* ================================================================ config (4.1) */
/* Float fields that must be finite and >= 0 (the "scales"). */
#define CFG_NONNEG(X) X(rms_eps) X(rope_base) X(attn_factor) X(embd_scale) X(rope_base_swa) \
    X(attn_softcap) X(final_softcap) X(yarn_factor) X(yarn_beta_fast) X(yarn_beta_slow) \
    X(rope_linear) X(expert_scale) X(attn_temp_scale) X(attn_scale) X(residual_scale) \
    X(logit_scale) X(clamp_kqv)

static int tail_nonzero(const jlm_config *c, int tail)
{
    switch (tail) {
    case 1: return c->moe_step || c->attn_temp_scale != 0 || c->attn_temp_floor || c->attn_temp_offset != 0;
    case 2: return c->attn_scale != 0 || c->residual_scale != 0 || c->logit_scale != 0;
    case 3: return c->clamp_kqv != 0;
    case 4: return c->head_dim_swa || c->n_kv_head_swa || c->n_rot_swa || c->flags2 || c->n_kv_shared || c->ple_dim;
    }
    return 0;
}

void jlm_fmt_config_encode(jlm_buf *b, const jlm_config *c)
{
    put_u16(b, c->arch);
    uint32_t u[14] = {c->n_layer, c->n_embd, c->n_head, c->n_kv_head, c->head_dim, c->n_rot, c->n_ffn,
                      c->n_vocab, c->n_ctx, c->n_expert, c->n_expert_used, c->n_ffn_exp, c->swa_window, c->swa_period};
    for (int i = 0; i < 14; i++)
        put_u32(b, u[i]);
    put_f32(b, c->rms_eps); put_f32(b, c->rope_base); put_f32(b, c->attn_factor);
    put_f32(b, c->embd_scale); put_f32(b, c->rope_base_swa);
    put_u32(b, c->flags);
    put_u32(b, c->n_ffn_shexp);
    put_u32(b, c->ssm_conv_kernel); put_u32(b, c->ssm_groups); put_u32(b, c->ssm_inner);
    put_u32(b, c->ssm_state); put_u32(b, c->ssm_n_head_v);
    put_u32(b, c->n_layer_kinds);
    buf_put(b, c->layer_kinds, c->n_layer_kinds);
    for (int i = 0; i < 4; i++)
        put_u32(b, c->rope_sections[i]);
    put_f32(b, c->attn_softcap); put_f32(b, c->final_softcap); put_f32(b, c->yarn_factor);
    put_u32(b, c->yarn_orig_ctx); put_f32(b, c->yarn_beta_fast); put_f32(b, c->yarn_beta_slow);
    put_f32(b, c->rope_linear); put_u32(b, c->head_dim_v); put_u32(b, c->n_dense_lead);
    put_u32(b, c->q_lora_rank); put_u32(b, c->kv_lora_rank); put_f32(b, c->yarn_log_mul);
    put_f32(b, c->expert_scale); put_u32(b, c->n_expert_group); put_u32(b, c->n_expert_group_used);
    int last = 0;
    for (int t = 1; t <= 4; t++)
        if (tail_nonzero(c, t))
            last = t;
    if (last >= 1) {
        put_u32(b, c->moe_step); put_f32(b, c->attn_temp_scale);
        put_u32(b, c->attn_temp_floor); put_f32(b, c->attn_temp_offset);
    }
    if (last >= 2) { put_f32(b, c->attn_scale); put_f32(b, c->residual_scale); put_f32(b, c->logit_scale); }
    if (last >= 3) put_f32(b, c->clamp_kqv);
    if (last >= 4) {
        put_u32(b, c->head_dim_swa); put_u32(b, c->n_kv_head_swa); put_u32(b, c->n_rot_swa);
        put_u32(b, c->flags2); put_u32(b, c->n_kv_shared); put_u32(b, c->ple_dim);
    }
}

int jlm_fmt_config_decode(const uint8_t *p, size_t len, jlm_arena *a, jlm_config *out,
                          const char *what, jlm_err *err)
{
    cur c = {p, p + len, what, "config record", p, err, 0};
    jlm_config k = {0};
    k.arch = get_u16(&c, "Arch");
    uint32_t *u[14] = {&k.n_layer, &k.n_embd, &k.n_head, &k.n_kv_head, &k.head_dim, &k.n_rot, &k.n_ffn,
                       &k.n_vocab, &k.n_ctx, &k.n_expert, &k.n_expert_used, &k.n_ffn_exp, &k.swa_window, &k.swa_period};
    for (int i = 0; i < 14; i++)
        *u[i] = get_u32(&c, "dimensions");
    k.rms_eps = get_f32(&c, "RMSEps"); k.rope_base = get_f32(&c, "RopeBase");
    k.attn_factor = get_f32(&c, "AttnFactor"); k.embd_scale = get_f32(&c, "EmbdScale");
    k.rope_base_swa = get_f32(&c, "RopeBaseSWA");
    k.flags = get_u32(&c, "Flags");
    k.n_ffn_shexp = get_u32(&c, "NFFNShExp");
    k.ssm_conv_kernel = get_u32(&c, "SSM"); k.ssm_groups = get_u32(&c, "SSM");
    k.ssm_inner = get_u32(&c, "SSM"); k.ssm_state = get_u32(&c, "SSM"); k.ssm_n_head_v = get_u32(&c, "SSM");
    k.n_layer_kinds = get_count(&c, 1, "LayerKinds");
    const uint8_t *lk = take(&c, k.n_layer_kinds, "LayerKinds");
    if (lk && k.n_layer_kinds) {
        k.layer_kinds = arr_alloc(&c, a, k.n_layer_kinds, 1);
        if (k.layer_kinds)
            memcpy(k.layer_kinds, lk, k.n_layer_kinds);
    }
    for (int i = 0; i < 4; i++)
        k.rope_sections[i] = get_u32(&c, "RopeSections");
    k.attn_softcap = get_f32(&c, "AttnSoftcap"); k.final_softcap = get_f32(&c, "FinalSoftcap");
    k.yarn_factor = get_f32(&c, "YarnFactor"); k.yarn_orig_ctx = get_u32(&c, "YarnOrigCtx");
    k.yarn_beta_fast = get_f32(&c, "YarnBetaFast"); k.yarn_beta_slow = get_f32(&c, "YarnBetaSlow");
    k.rope_linear = get_f32(&c, "RopeLinear"); k.head_dim_v = get_u32(&c, "HeadDimV");
    k.n_dense_lead = get_u32(&c, "NDenseLead"); k.q_lora_rank = get_u32(&c, "QLoraRank");
    k.kv_lora_rank = get_u32(&c, "KVLoraRank"); k.yarn_log_mul = get_f32(&c, "YarnLogMul");
    k.expert_scale = get_f32(&c, "ExpertScale"); k.n_expert_group = get_u32(&c, "NExpertGroup");
    k.n_expert_group_used = get_u32(&c, "NExpertGroupUsed");
    /* Optional tails: a reader that runs out of bytes treats the rest as zero;
     * a tail cut in the middle is malformed. */
    if (!c.rc && left(&c) >= 1) {
        k.moe_step = get_u32(&c, "tail 1"); k.attn_temp_scale = get_f32(&c, "tail 1");
        k.attn_temp_floor = get_u32(&c, "tail 1"); k.attn_temp_offset = get_f32(&c, "tail 1");
    }
    if (!c.rc && left(&c) >= 1) {
        k.attn_scale = get_f32(&c, "tail 2"); k.residual_scale = get_f32(&c, "tail 2");
        k.logit_scale = get_f32(&c, "tail 2");
    }
    if (!c.rc && left(&c) >= 1)
        k.clamp_kqv = get_f32(&c, "tail 3");
    if (!c.rc && left(&c) >= 1) {
        k.head_dim_swa = get_u32(&c, "tail 4"); k.n_kv_head_swa = get_u32(&c, "tail 4");
        k.n_rot_swa = get_u32(&c, "tail 4"); k.flags2 = get_u32(&c, "tail 4");
        k.n_kv_shared = get_u32(&c, "tail 4"); k.ple_dim = get_u32(&c, "tail 4");
    }
    /* bytes past tail 4 belong to reserved later tails: ignored */
    if (c.rc)
        return c.rc;
    int rc = jlm_fmt_config_check(&k, what, err);
    if (rc)
        return rc;
    *out = k;
    return JLM_OK;
}

int jlm_fmt_config_check(const jlm_config *k, const char *what, jlm_err *err)
{
    const char *an = jlm_fmt_arch_name(k->arch);
    if (!an)
        return jlm_errf(err, JLM_EFORMAT, "%s: config: unknown architecture code %u", what, k->arch);
    if (k->n_layer_kinds != 0 && k->n_layer_kinds != k->n_layer)
        return jlm_errf(err, JLM_EFORMAT, "%s: config: %u layer kinds for %u layers", what, k->n_layer_kinds, k->n_layer);
    if (k->flags & ~JLM_F_KNOWN_MASK)
        return jlm_errf(err, JLM_EFORMAT, "%s: config: flags 0x%x use reserved or retired bits (0x%x)", what,
                        k->flags, k->flags & ~JLM_F_KNOWN_MASK);
    int text = k->arch != JLM_ARCH_NONE && k->arch != JLM_ARCH_CLIP;
    if (text) {
        if (k->n_head == 0 || k->n_kv_head == 0 || k->n_head % k->n_kv_head)
            return jlm_errf(err, JLM_EFORMAT, "%s: config: %u heads is not a multiple of %u kv heads", what,
                            k->n_head, k->n_kv_head);
        if (k->head_dim == 0)
            return jlm_errf(err, JLM_EFORMAT, "%s: config: head dim is 0", what);
    } else if (k->arch == JLM_ARCH_NONE && k->n_layer != 0) {
        return jlm_errf(err, JLM_EFORMAT, "%s: config: architecture 'none' with %u layers", what, k->n_layer);
    }
    if (k->n_expert_used > k->n_expert)
        return jlm_errf(err, JLM_EFORMAT, "%s: config: %u experts used of %u", what, k->n_expert_used, k->n_expert);
#define CHECK_NONNEG(f) \
    if (!isfinite(k->f) || k->f < 0) \
        return jlm_errf(err, JLM_EFORMAT, "%s: config: " #f " is %g, expected finite and >= 0", what, (double)k->f);
    CFG_NONNEG(CHECK_NONNEG)
#undef CHECK_NONNEG
    if (!isfinite(k->yarn_log_mul) || !isfinite(k->attn_temp_offset))
        return jlm_errf(err, JLM_EFORMAT, "%s: config: a float field is not finite", what);
    return jlm_fmt_config_bounds(k, what, err);
}

/* ================================================================ vision (4.2) */
void jlm_fmt_vision_encode(jlm_buf *b, const jlm_vision *v)
{
    uint32_t u[8] = {v->n_layer, v->n_embd, v->n_head, v->n_ffn, v->image_size, v->patch_size, v->proj_dim, v->scale};
    for (int i = 0; i < 8; i++)
        put_u32(b, u[i]);
    put_f32(b, v->eps);
    put_u16(b, v->projector);
    for (int i = 0; i < 3; i++) put_f32(b, v->mean[i]);
    for (int i = 0; i < 3; i++) put_f32(b, v->std[i]);
    put_u32(b, v->flags);
    int last = (v->min_pixels || v->max_pixels) ? 3 : (v->win_pattern || v->win_size) ? 2 :
               (v->min_tiles || v->max_tiles) ? 1 : 0;
    if (last >= 1) { put_u32(b, v->min_tiles); put_u32(b, v->max_tiles); }
    if (last >= 2) { put_u32(b, v->win_pattern); put_u32(b, v->win_size); }
    if (last >= 3) { put_u32(b, v->min_pixels); put_u32(b, v->max_pixels); }
}

int jlm_fmt_vision_decode(const uint8_t *p, size_t len, jlm_vision *out, const char *what, jlm_err *err)
{
    cur c = {p, p + len, what, "vision record", p, err, 0};
    jlm_vision v = {0};
    uint32_t *u[8] = {&v.n_layer, &v.n_embd, &v.n_head, &v.n_ffn, &v.image_size, &v.patch_size, &v.proj_dim, &v.scale};
    for (int i = 0; i < 8; i++)
        *u[i] = get_u32(&c, "dimensions");
    v.eps = get_f32(&c, "Eps");
    v.projector = get_u16(&c, "Projector");
    for (int i = 0; i < 3; i++) v.mean[i] = get_f32(&c, "Mean");
    for (int i = 0; i < 3; i++) v.std[i] = get_f32(&c, "Std");
    v.flags = get_u32(&c, "Flags");
    if (!c.rc && left(&c)) { v.min_tiles = get_u32(&c, "tail 1"); v.max_tiles = get_u32(&c, "tail 1"); }
    if (!c.rc && left(&c)) { v.win_pattern = get_u32(&c, "tail 2"); v.win_size = get_u32(&c, "tail 2"); }
    if (!c.rc && left(&c)) { v.min_pixels = get_u32(&c, "tail 3"); v.max_pixels = get_u32(&c, "tail 3"); }
    if (c.rc)
        return c.rc;
    if (!isfinite(v.eps) || v.eps < 0)
        return jlm_errf(err, JLM_EFORMAT, "%s: vision record: eps %g", what, (double)v.eps);
    *out = v;
    return JLM_OK;
}

/* ================================================================ vocab (4.3) */
static void put_preop(jlm_buf *b, const jlm_preop *o)
{
    put_u8(b, o->kind); put_u8(b, o->contractions); put_u8(b, o->case_fold); put_u8(b, o->letter_marks);
    put_u8(b, o->digit_group); put_u8(b, o->use_regex); put_u8(b, o->add_prefix_space); put_u8(b, o->individual);
    put_str(b, o->behavior);
    put_u8(b, o->case_runs); put_u8(b, o->suffix_contract); put_u8(b, o->punct_slash); put_u8(b, o->han_runs);
}

void jlm_fmt_vocab_encode(jlm_buf *b, const jlm_vocab *v)
{
    put_u8(b, v->kind);
    put_u32(b, v->n_tokens);
    for (uint32_t i = 0; i < v->n_tokens; i++) put_str(b, v->tokens[i]);
    put_u32(b, v->n_scores);
    for (uint32_t i = 0; i < v->n_scores; i++) put_f32(b, v->scores[i]);
    put_u32(b, v->n_token_kinds);
    buf_put(b, v->token_kinds, v->n_token_kinds);
    put_u32(b, v->n_merges);
    for (uint32_t i = 0; i < v->n_merges; i++) { put_str(b, v->merges[2 * i]); put_str(b, v->merges[2 * i + 1]); }
    put_u32(b, v->n_added);
    for (uint32_t i = 0; i < v->n_added; i++) {
        const jlm_added_token *t = &v->added[i];
        put_i32(b, t->id); put_str(b, t->content);
        put_u8(b, t->special); put_u8(b, t->lstrip); put_u8(b, t->rstrip);
        put_u8(b, t->normalized); put_u8(b, t->single_word);
    }
    int32_t ids[6] = {v->bos, v->eos, v->unk, v->pad, v->sep, v->mask};
    for (int i = 0; i < 6; i++) put_i32(b, ids[i]);
    put_u8(b, v->add_bos); put_u8(b, v->add_eos); put_u8(b, v->add_space_prefix);
    put_u8(b, v->byte_fallback); put_u8(b, v->ignore_merges);
    put_u32(b, v->n_preops);
    for (uint32_t i = 0; i < v->n_preops; i++) put_preop(b, &v->preops[i]);
    put_str(b, v->pre_name);
    put_u32(b, v->n_templates);
    for (uint32_t i = 0; i < v->n_templates; i++) { put_str(b, v->templates[2 * i]); put_str(b, v->templates[2 * i + 1]); }
    /* tails: written only if they or a later tail are non-empty */
    if (v->n_punct_no_newline || v->n_stop) {
        put_u32(b, v->n_punct_no_newline);
        buf_put(b, v->punct_no_newline, v->n_punct_no_newline);
    }
    if (v->n_stop) {
        put_u32(b, v->n_stop);
        for (uint32_t i = 0; i < v->n_stop; i++) put_i32(b, v->stop[i]);
    }
}

static void get_preop(cur *c, jlm_arena *a, jlm_preop *o)
{
    o->kind = get_u8(c, "PreOp.Kind");
    o->contractions = get_bool(c, "PreOp.Contractions"); o->case_fold = get_bool(c, "PreOp.CaseFold");
    o->letter_marks = get_bool(c, "PreOp.LetterMarks"); o->digit_group = get_u8(c, "PreOp.DigitGroup");
    o->use_regex = get_bool(c, "PreOp.UseRegex"); o->add_prefix_space = get_bool(c, "PreOp.AddPrefixSpace");
    o->individual = get_bool(c, "PreOp.Individual");
    o->behavior = get_str(c, a, "PreOp.Behavior");
    o->case_runs = get_bool(c, "PreOp.CaseRuns"); o->suffix_contract = get_bool(c, "PreOp.SuffixContract");
    o->punct_slash = get_bool(c, "PreOp.PunctSlash"); o->han_runs = get_bool(c, "PreOp.HanRuns");
    if (!c->rc && (o->kind < 1 || o->kind > 9))
        c->rc = jlm_errf(c->err, JLM_EFORMAT, "%s: vocab record: unknown PreOp kind %u", c->what, o->kind);
}

int jlm_fmt_vocab_decode(const uint8_t *p, size_t len, jlm_arena *a, jlm_vocab *out,
                         const char *what, jlm_err *err)
{
    cur c = {p, p + len, what, "vocab record", p, err, 0};
    jlm_vocab v = {0};
    v.kind = get_u8(&c, "Kind");
    if (!c.rc && v.kind > JLM_VOCAB_SPBPE)
        return jlm_errf(err, JLM_EFORMAT, "%s: vocab record: unknown kind %u", what, v.kind);
    v.n_tokens = get_count(&c, 4, "Tokens");
    v.tokens = arr_alloc(&c, a, v.n_tokens, sizeof(jlm_str));
    for (uint32_t i = 0; i < v.n_tokens && !c.rc; i++) v.tokens[i] = get_str(&c, a, "token");
    v.n_scores = get_count(&c, 4, "Scores");
    if (!c.rc && v.n_scores && v.n_scores != v.n_tokens)
        return jlm_errf(err, JLM_EFORMAT, "%s: vocab record: %u scores for %u tokens", what, v.n_scores, v.n_tokens);
    v.scores = arr_alloc(&c, a, v.n_scores, sizeof(float));
    for (uint32_t i = 0; i < v.n_scores && !c.rc; i++) v.scores[i] = get_f32(&c, "score");
    v.n_token_kinds = get_count(&c, 1, "TokenKinds");
    if (!c.rc && v.n_token_kinds && v.n_token_kinds != v.n_tokens)
        return jlm_errf(err, JLM_EFORMAT, "%s: vocab record: %u token kinds for %u tokens", what, v.n_token_kinds, v.n_tokens);
    const uint8_t *tk = take(&c, v.n_token_kinds, "TokenKinds");
    v.token_kinds = arr_alloc(&c, a, v.n_token_kinds, 1);
    if (tk && v.token_kinds) memcpy(v.token_kinds, tk, v.n_token_kinds);
    v.n_merges = get_count(&c, 8, "Merges");
    v.merges = arr_alloc(&c, a, (size_t)v.n_merges * 2, sizeof(jlm_str));
    for (uint32_t i = 0; i < 2 * v.n_merges && !c.rc; i++) v.merges[i] = get_str(&c, a, "merge");
    v.n_added = get_count(&c, 4 + 4 + 5, "AddedTokens");
    v.added = arr_alloc(&c, a, v.n_added, sizeof(jlm_added_token));
    for (uint32_t i = 0; i < v.n_added && !c.rc; i++) {
        jlm_added_token *t = &v.added[i];
        t->id = get_i32(&c, "added.id"); t->content = get_str(&c, a, "added.content");
        t->special = get_bool(&c, "added.special"); t->lstrip = get_bool(&c, "added.lstrip");
        t->rstrip = get_bool(&c, "added.rstrip"); t->normalized = get_bool(&c, "added.normalized");
        t->single_word = get_bool(&c, "added.single_word");
        if (!c.rc && (t->id < 0 || (uint32_t)t->id >= v.n_tokens))
            return jlm_errf(err, JLM_EFORMAT, "%s: vocab record: added token id %d outside [0, %u)", what, t->id, v.n_tokens);
    }
    int32_t *ids[6] = {&v.bos, &v.eos, &v.unk, &v.pad, &v.sep, &v.mask};
    for (int i = 0; i < 6; i++) {
        *ids[i] = get_i32(&c, "special ids");
        if (!c.rc && (*ids[i] < -1 || (*ids[i] >= 0 && (uint32_t)*ids[i] >= v.n_tokens)))
            return jlm_errf(err, JLM_EFORMAT, "%s: vocab record: special id %d outside [-1, %u)", what, *ids[i], v.n_tokens);
    }
    v.add_bos = get_bool(&c, "AddBOS"); v.add_eos = get_bool(&c, "AddEOS");
    v.add_space_prefix = get_bool(&c, "AddSpacePrefix"); v.byte_fallback = get_bool(&c, "ByteFallback");
    v.ignore_merges = get_bool(&c, "IgnoreMerges");
    v.n_preops = get_count(&c, 17, "PreOps");
    v.preops = arr_alloc(&c, a, v.n_preops, sizeof(jlm_preop));
    for (uint32_t i = 0; i < v.n_preops && !c.rc; i++) get_preop(&c, a, &v.preops[i]);
    v.pre_name = get_str(&c, a, "PreName");
    v.n_templates = get_count(&c, 8, "ChatTemplates");
    v.templates = arr_alloc(&c, a, (size_t)v.n_templates * 2, sizeof(jlm_str));
    for (uint32_t i = 0; i < 2 * v.n_templates && !c.rc; i++) v.templates[i] = get_str(&c, a, "template");
    if (!c.rc && left(&c)) {
        v.n_punct_no_newline = get_count(&c, 1, "PunctNoNewline");
        if (!c.rc && v.n_punct_no_newline != v.n_preops)
            return jlm_errf(err, JLM_EFORMAT, "%s: vocab record: %u PunctNoNewline flags for %u PreOps", what,
                            v.n_punct_no_newline, v.n_preops);
        v.punct_no_newline = arr_alloc(&c, a, v.n_punct_no_newline, 1);
        for (uint32_t i = 0; i < v.n_punct_no_newline && !c.rc; i++) v.punct_no_newline[i] = get_bool(&c, "PunctNoNewline");
    }
    if (!c.rc && left(&c)) {
        v.n_stop = get_count(&c, 4, "Stop");
        v.stop = arr_alloc(&c, a, v.n_stop, sizeof(int32_t));
        for (uint32_t i = 0; i < v.n_stop && !c.rc; i++) {
            v.stop[i] = get_i32(&c, "stop id");
            if (!c.rc && (v.stop[i] < 0 || (uint32_t)v.stop[i] >= v.n_tokens))
                return jlm_errf(err, JLM_EFORMAT, "%s: vocab record: stop id %d outside [0, %u)", what, v.stop[i], v.n_tokens);
        }
    }
    if (c.rc)
        return c.rc;
    *out = v;
    return JLM_OK;
}

/* ================================================================ tensor table (4.4) */
void jlm_fmt_tensor_encode(jlm_buf *b, const jlm_tensor *t)
{
    put_u16(b, t->role); put_i32(b, t->block); put_i32(b, t->index);
    put_u8(b, t->type); put_u8(b, t->ndim);
    for (int i = 0; i < t->ndim; i++) put_u64(b, t->dims[i]);
    put_u64(b, t->qs_off); put_u64(b, t->d_off); put_u64(b, t->sc_off);
    put_str16(b, t->name);
}

int jlm_fmt_table_decode(const uint8_t *p, size_t len, uint32_t n, jlm_arena *a, jlm_tensor **out,
                         const char *what, jlm_err *err)
{
    cur c = {p, p + len, what, "tensor table", p, err, 0};
    const size_t min_rec = 2 + 4 + 4 + 1 + 1 + 8 + 24 + 2;
    if ((uint64_t)n * min_rec > len)
        return jlm_errf(err, JLM_EFORMAT, "%s: tensor table: %u records need at least %llu bytes, table has %zu",
                        what, n, (unsigned long long)n * min_rec, len);
    jlm_tensor *ts = arr_alloc(&c, a, n ? n : 1, sizeof(jlm_tensor));
    for (uint32_t i = 0; i < n && !c.rc; i++) {
        jlm_tensor *t = &ts[i];
        t->role = get_u16(&c, "role"); t->block = get_i32(&c, "block"); t->index = get_i32(&c, "index");
        t->type = get_u8(&c, "type"); t->ndim = get_u8(&c, "ndim");
        if (!c.rc && (t->ndim < 1 || t->ndim > 4))
            return jlm_errf(err, JLM_EFORMAT, "%s: tensor table: record %u has ndim %u, expected 1..4", what, i, t->ndim);
        for (int d = 0; d < 4; d++) t->dims[d] = 1;
        for (int d = 0; d < t->ndim && !c.rc; d++) t->dims[d] = get_u64(&c, "dims");
        t->qs_off = get_u64(&c, "qsOff"); t->d_off = get_u64(&c, "dOff"); t->sc_off = get_u64(&c, "scOff");
        t->name = get_str16(&c, a, "name");
        if (!c.rc && !jlm_fmt_type_traits(t->type))
            return jlm_errf(err, JLM_EFORMAT, "%s: tensor '%s': unknown type code %u", what, t->name.s, t->type);
        if (!c.rc && (t->block < -1 || t->index < -1))
            return jlm_errf(err, JLM_EFORMAT, "%s: tensor '%s': block %d / index %d below -1", what, t->name.s, t->block, t->index);
    }
    if (c.rc)
        return c.rc;
    if (left(&c))
        return jlm_errf(err, JLM_EFORMAT, "%s: tensor table: %zu bytes left after %u records", what, left(&c), n);
    *out = ts;
    return JLM_OK;
}

/* ================================================================ fingerprint (4.7) */
void jlm_fmt_fingerprint_encode(jlm_buf *b, const jlm_fingerprint *f)
{
    put_str16(b, f->host); put_str16(b, f->device); put_str16(b, f->writer);
    put_u64(b, f->vram);
}

int jlm_fmt_fingerprint_decode(const uint8_t *p, size_t len, jlm_arena *a, jlm_fingerprint *out,
                               const char *what, jlm_err *err)
{
    cur c = {p, p + len, what, "fingerprint", p, err, 0};
    jlm_fingerprint f = {0};
    f.host = get_str16(&c, a, "Host"); f.device = get_str16(&c, a, "Device");
    f.writer = get_str16(&c, a, "Writer"); f.vram = get_u64(&c, "VRAM");
    if (c.rc)
        return c.rc;
    *out = f;
    return JLM_OK;
}

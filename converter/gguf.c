/* gguf.c - the bounded GGUF v2/v3 parser (see gguf.h; decisions in docs/gguf.md).
 *
 * Shape: a sequential reader (struct rd) over a prefix of the file that grows
 * on demand up to META_CAP, so only the metadata is ever read, never tensor
 * data. Every count and length is checked against the bytes left in the
 * whole file before the buffer grows or anything is allocated. Everything
 * returned (strings, arrays, tables) is copied into one arena owned by the
 * handle, so the read buffer is freed as soon as parsing ends.
 */
#include "converter/gguf.h"
#include "base/io.h"
#include "base/beneath.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Metadata (header + kv + tensor infos) larger than this is refused: the
 * biggest real vocabularies (256k tokens + merges) take ~20 MiB, so 512 MiB
 * only bounds the memory a hostile file can make us use. */
#define META_CAP        ((uint64_t)512 << 20)
#define FIRST_READ      ((uint64_t)1 << 20)   /* first read of a file: 1 MiB */
#define MAX_ARR_DEPTH   8                     /* nested arrays: recursion bound */
#define ARENA_CHUNK     ((size_t)256 << 10)
#define MIN_KV_BYTES    13   /* key len 8 + (empty key) + type 4 + 1-byte value */
#define MIN_TI_BYTES    32   /* name len 8 + n_dims 4 + ne 8 + type 4 + offset 8 */
#define MIN_NESTED      12   /* nested array: elem type 4 + count 8 */
#define DEFAULT_ALIGN   32

/* ======================================================================
 * Arena: every string/array handed out lives here until jlm_gguf_close.
 * ==================================================================== */

typedef struct achunk {
    struct achunk *next;
    size_t used, cap;
    size_t pad_;                /* header is 32 bytes: data stays 16-aligned */
} achunk;

typedef struct arena { achunk *head; } arena;

static void *ar_alloc(arena *a, size_t n)
{
    if (n > SIZE_MAX / 2)
        return NULL;
    n = n ? (n + 15) & ~(size_t)15 : 16;
    achunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > ARENA_CHUNK / 4 ? n : ARENA_CHUNK;
        achunk *nc = malloc(sizeof *nc + cap);
        if (!nc)
            return NULL;
        nc->used = 0;
        nc->cap = cap;
        if (c && cap == n) {     /* a big one-off: keep filling the current chunk */
            nc->next = c->next;
            c->next = nc;
        } else {
            nc->next = c;
            a->head = nc;
        }
        c = nc;
    }
    void *p = (char *)(c + 1) + c->used;
    c->used += n;
    return p;
}

static void ar_free(arena *a)
{
    for (achunk *c = a->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    a->head = NULL;
}

/* ======================================================================
 * Name index: open addressing over a table of structs whose first member
 * is a jlm_gguf_str (kv.key, tensor.name). Used for duplicates and lookups.
 * ==================================================================== */

typedef struct hidx {
    uint64_t *slot;             /* index + 1; 0 = empty */
    uint64_t  mask;
    const char *base;           /* the table being indexed */
    size_t    stride;
} hidx;

_Static_assert(offsetof(jlm_gguf_kv, key) == 0, "hidx reads the key at offset 0");
_Static_assert(offsetof(jlm_gguf_tensor, name) == 0, "hidx reads the name at offset 0");

static uint64_t fnv1a(const char *s, uint64_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static int hidx_init(hidx *h, const void *base, size_t stride, uint64_t n)
{
    uint64_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    h->slot = calloc(cap, sizeof *h->slot);
    if (!h->slot)
        return JLM_ENOMEM;
    h->mask = cap - 1;
    h->base = base;
    h->stride = stride;
    return 0;
}

static const jlm_gguf_str *hidx_name(const hidx *h, uint64_t i)
{
    return (const jlm_gguf_str *)(h->base + i * h->stride);
}

/* Slot holding name, or the empty slot where it would go. */
static uint64_t *hidx_probe(const hidx *h, const char *s, uint64_t n)
{
    for (uint64_t i = fnv1a(s, n) & h->mask;; i = (i + 1) & h->mask) {
        if (!h->slot[i])
            return &h->slot[i];
        const jlm_gguf_str *e = hidx_name(h, h->slot[i] - 1);
        if (e->len == n && memcmp(e->s, s, n) == 0)
            return &h->slot[i];
    }
}

/* Inserts entry i; returns the index of an earlier entry of the same name, or -1. */
static int64_t hidx_add(hidx *h, uint64_t i)
{
    const jlm_gguf_str *e = hidx_name(h, i);
    uint64_t *s = hidx_probe(h, e->s, e->len);
    if (*s)
        return (int64_t)(*s - 1);
    *s = i + 1;
    return -1;
}

static const void *hidx_find(const hidx *h, const char *name)
{
    if (!h->slot || !name)
        return NULL;
    uint64_t *s = hidx_probe(h, name, strlen(name));
    return *s ? h->base + (*s - 1) * h->stride : NULL;
}

/* ======================================================================
 * Reader: a cursor over a prefix [0, avail) of a file of len bytes.
 * ==================================================================== */

typedef struct rd {
    const char    *what;        /* file name, for messages */
    int            fd;          /* -1: in-memory image */
    uint8_t       *own;         /* fd mode: the growing buffer */
    const uint8_t *buf;
    uint64_t       avail;       /* bytes of the file present in buf */
    uint64_t       len;         /* file length */
    uint64_t       pos;
    char           ctx[192];    /* the object being parsed: "kv 3 'general.name'" */
    jlm_err       *err;
    arena         *ar;
} rd;

static uint64_t rd_left(const rd *r) { return r->len - r->pos; }

/* Makes [0, upto) present in buf; upto <= len is the caller's check. */
static int rd_grow(rd *r, uint64_t upto)
{
    if (upto > META_CAP)
        return jlm_errf(r->err, JLM_EFORMAT,
                        "%s: %s: metadata reaches offset %" PRIu64 ", past the %" PRIu64 " MiB cap",
                        r->what, r->ctx, upto, META_CAP >> 20);
    uint64_t want = r->avail * 2 > upto ? r->avail * 2 : upto;
    if (want < FIRST_READ)
        want = FIRST_READ;
    if (want > r->len)
        want = r->len;
    if (want > META_CAP)
        want = META_CAP;
    uint8_t *nb = realloc(r->own, want);
    if (!nb)
        return jlm_errf(r->err, JLM_ENOMEM, "%s: %" PRIu64 " bytes for metadata", r->what, want);
    r->own = nb;
    r->buf = nb;
    size_t got;
    int e = jlm_io_pread_full(NULL, r->fd, nb + r->avail, want - r->avail, r->avail, &got);
    r->avail += got;
    if (e)
        return jlm_errf(r->err, JLM_EIO, "%s: read at offset %" PRIu64 ": %s", r->what, r->avail,
                        jlm_io_strerror(e));
    return 0;
}

/* n bytes at pos must exist in the file; makes them present in buf. */
static int rd_need(rd *r, uint64_t n, const char *field)
{
    if (n > rd_left(r))
        return jlm_errf(r->err, JLM_EFORMAT,
                        "%s: %s: %s at offset %" PRIu64 " needs %" PRIu64 " bytes, only %" PRIu64
                        " left (file is %" PRIu64 " bytes)",
                        r->what, r->ctx, field, r->pos, n, rd_left(r), r->len);
    return r->pos + n <= r->avail ? 0 : rd_grow(r, r->pos + n);
}

static uint64_t le(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int rd_uint(rd *r, unsigned n, uint64_t *v, const char *field)
{
    int rc = rd_need(r, n, field);
    if (rc)
        return rc;
    *v = le(r->buf + r->pos, n);
    r->pos += n;
    return 0;
}

static int rd_u32(rd *r, uint32_t *v, const char *field)
{
    uint64_t x = 0;
    int rc = rd_uint(r, 4, &x, field);
    *v = (uint32_t)x;
    return rc;
}

/* A gguf string (u64 len + bytes) copied NUL-terminated into the arena.
 * ident: a key or tensor name, which may not contain NUL bytes. */
static int rd_str(rd *r, jlm_gguf_str *out, const char *field, int ident)
{
    uint64_t n, at = r->pos;
    int rc = rd_uint(r, 8, &n, field);
    if (rc)
        return rc;
    if (n > rd_left(r))
        return jlm_errf(r->err, JLM_EFORMAT,
                        "%s: %s: %s string length %" PRIu64 " at offset %" PRIu64
                        " exceeds the %" PRIu64 " bytes left (file is %" PRIu64 " bytes)",
                        r->what, r->ctx, field, n, at, rd_left(r), r->len);
    if ((rc = rd_need(r, n, field)))
        return rc;
    const uint8_t *src = r->buf + r->pos;
    if (ident && memchr(src, 0, n))
        return jlm_errf(r->err, JLM_EFORMAT, "%s: %s: %s at offset %" PRIu64 " contains a NUL byte",
                        r->what, r->ctx, field, at);
    char *s = ar_alloc(r->ar, n + 1);
    if (!s)
        return jlm_errf(r->err, JLM_ENOMEM, "%s: %s: %s of %" PRIu64 " bytes", r->what, r->ctx, field, n);
    memcpy(s, src, n);
    s[n] = '\0';
    r->pos += n;
    out->s = s;
    out->len = n;
    return 0;
}

/* ======================================================================
 * Metadata values
 * ==================================================================== */

/* Bytes of a fixed-size value type; 0 for STRING/ARRAY; -1 unknown. */
static int vtype_size(uint32_t t)
{
    static const signed char sz[] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };
    return t < sizeof sz ? sz[t] : -1;
}

static const char *vtype_name(uint32_t t)
{
    static const char *const nm[] = { "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
                                      "string", "array", "u64", "i64", "f64" };
    return t < sizeof nm / sizeof nm[0] ? nm[t] : "unknown";
}

static int vtype_is_int(uint32_t t)
{
    return t <= GGUF_T_I32 || t == GGUF_T_U64 || t == GGUF_T_I64;
}

static int vtype_is_signed(uint32_t t)
{
    return t == GGUF_T_I8 || t == GGUF_T_I16 || t == GGUF_T_I32 || t == GGUF_T_I64;
}

static int bad_bool(rd *r, uint64_t at, unsigned v)
{
    return jlm_errf(r->err, JLM_EFORMAT, "%s: %s: bool at offset %" PRIu64 " is %u, not 0 or 1",
                    r->what, r->ctx, at, v);
}

/* A fixed-size scalar of type t, widened into kv->v. */
static int rd_scalar(rd *r, uint32_t t, jlm_gguf_kv *kv)
{
    unsigned sz = (unsigned)vtype_size(t);
    uint64_t raw, at = r->pos;
    int rc = rd_uint(r, sz, &raw, "value");
    if (rc)
        return rc;
    kv->n = 1;
    if (t == GGUF_T_F32) {
        uint32_t b = (uint32_t)raw;
        float f;
        memcpy(&f, &b, 4);
        kv->v.f = f;
    } else if (t == GGUF_T_F64) {
        memcpy(&kv->v.f, &raw, 8);
    } else if (t == GGUF_T_BOOL) {
        if (raw > 1)
            return bad_bool(r, at, (unsigned)raw);
        kv->v.b = (int)raw;
    } else if (vtype_is_signed(t) && sz < 8) {
        uint64_t sign = (uint64_t)1 << (8 * sz - 1);   /* sign-extend */
        kv->v.i = (int64_t)((raw ^ sign) - sign);
    } else {
        kv->v.u = raw;           /* unsigned, and i64 reinterpreted: same bits */
    }
    return 0;
}

static int rd_array(rd *r, jlm_gguf_kv *kv, unsigned depth);

/* Elements of a non-string, non-array array: copied as stored. */
static int rd_array_fixed(rd *r, uint32_t et, uint64_t count, jlm_gguf_kv *kv)
{
    uint64_t n = count * (uint64_t)vtype_size(et);   /* <= bytes left: checked */
    uint8_t *a = ar_alloc(r->ar, n);
    if (!a)
        return jlm_errf(r->err, JLM_ENOMEM, "%s: %s: array of %" PRIu64 " bytes", r->what, r->ctx, n);
    memcpy(a, r->buf + r->pos, n);
    if (et == GGUF_T_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (a[i] > 1)
                return bad_bool(r, r->pos + i, a[i]);
    r->pos += n;
    kv->arr = a;
    return 0;
}

static int rd_array_elems(rd *r, uint32_t et, uint64_t count, jlm_gguf_kv *kv, unsigned depth)
{
    if (et != GGUF_T_STRING && et != GGUF_T_ARRAY)
        return rd_array_fixed(r, et, count, kv);
    size_t esz = et == GGUF_T_STRING ? sizeof(jlm_gguf_str) : sizeof(jlm_gguf_kv);
    void *a = ar_alloc(r->ar, count * esz);   /* count <= META_CAP / 8: no overflow */
    if (!a)
        return jlm_errf(r->err, JLM_ENOMEM, "%s: %s: array of %" PRIu64 " elements", r->what, r->ctx, count);
    kv->arr = a;
    if (et == GGUF_T_STRING) {
        jlm_gguf_str *s = a;
        for (uint64_t i = 0; i < count; i++) {   /* hot: one per vocab token */
            int rc = rd_str(r, &s[i], "array element", 0);
            if (rc)
                return rc;
        }
        return 0;
    }
    jlm_gguf_kv *sub = a;
    memset(sub, 0, count * esz);
    for (uint64_t i = 0; i < count; i++) {
        sub[i].key.s = "";
        sub[i].type = GGUF_T_ARRAY;
        int rc = rd_array(r, &sub[i], depth + 1);
        if (rc)
            return rc;
    }
    return 0;
}

/* u32 element type + u64 count + elements. */
static int rd_array(rd *r, jlm_gguf_kv *kv, unsigned depth)
{
    uint32_t et;
    uint64_t count, at;
    int rc = rd_u32(r, &et, "array element type");
    if (rc)
        return rc;
    int esz = vtype_size(et);
    if (esz < 0)
        return jlm_errf(r->err, JLM_EFORMAT, "%s: %s: unknown array element type %u at offset %" PRIu64,
                        r->what, r->ctx, et, r->pos - 4);
    if (et == GGUF_T_ARRAY && depth + 1 >= MAX_ARR_DEPTH)
        return jlm_errf(r->err, JLM_EFORMAT, "%s: %s: arrays nested deeper than %d at offset %" PRIu64,
                        r->what, r->ctx, MAX_ARR_DEPTH, r->pos - 4);
    at = r->pos;
    if ((rc = rd_uint(r, 8, &count, "array count")))
        return rc;
    uint64_t min = et == GGUF_T_STRING ? 8 : et == GGUF_T_ARRAY ? MIN_NESTED : (uint64_t)esz;
    if (count > rd_left(r) / min)
        return jlm_errf(r->err, JLM_EFORMAT,
                        "%s: %s: array count %" PRIu64 " of %s at offset %" PRIu64
                        " needs at least %" PRIu64 " bytes each, only %" PRIu64 " left",
                        r->what, r->ctx, count, vtype_name(et), at, min, rd_left(r));
    if ((rc = rd_need(r, count * min, "array")))   /* bounds what we allocate by META_CAP */
        return rc;
    kv->arr_type = et;
    kv->n = count;
    return rd_array_elems(r, et, count, kv, depth);
}

/* One kv pair: key, u32 type, value. */
static int rd_kv(rd *r, uint64_t i, jlm_gguf_kv *kv)
{
    snprintf(r->ctx, sizeof r->ctx, "kv %" PRIu64, i);
    int rc = rd_str(r, &kv->key, "key", 1);
    if (rc)
        return rc;
    snprintf(r->ctx, sizeof r->ctx, "kv %" PRIu64 " '%.120s'", i, kv->key.s);
    if ((rc = rd_u32(r, &kv->type, "value type")))
        return rc;
    if (vtype_size(kv->type) < 0)
        return jlm_errf(r->err, JLM_EFORMAT, "%s: %s: unknown value type %u at offset %" PRIu64,
                        r->what, r->ctx, kv->type, r->pos - 4);
    if (kv->type == GGUF_T_ARRAY)
        return rd_array(r, kv, 0);
    if (kv->type == GGUF_T_STRING) {
        kv->n = 1;
        return rd_str(r, &kv->v.str, "value", 0);
    }
    return rd_scalar(r, kv->type, kv);
}

/* ======================================================================
 * One file (part): header, kv pairs, tensor infos, data section.
 * ==================================================================== */

typedef struct part {
    uint32_t         version;
    uint64_t         n_kv;
    jlm_gguf_kv     *kv;
    uint64_t         n_tensors;
    jlm_gguf_tensor *tensors;
    uint64_t         alignment;
    uint64_t         len;       /* file length */
    hidx             kv_idx;
    hidx             t_idx;
} part;

static void part_free_idx(part *p)
{
    free(p->kv_idx.slot);
    free(p->t_idx.slot);
    p->kv_idx.slot = p->t_idx.slot = NULL;
}

static int rd_header(rd *r, part *p)
{
    snprintf(r->ctx, sizeof r->ctx, "header");
    int rc = rd_need(r, 4, "magic");
    if (rc)
        return rc;
    const uint8_t *m = r->buf;
    if (memcmp(m, "GGUF", 4) != 0)
        return jlm_errf(r->err, JLM_EFORMAT,
                        "%s: not a GGUF file (no \"GGUF\" magic at offset 0)", r->what);
    r->pos = 4;
    uint32_t v;
    if ((rc = rd_u32(r, &v, "version")))
        return rc;
    uint32_t swapped = (v >> 24) | ((v >> 8) & 0xff00) | ((v << 8) & 0xff0000) | (v << 24);
    if (swapped >= 1 && swapped <= 3)
        return jlm_errf(r->err, JLM_EVERSION,
                        "%s: version 0x%08x at offset 4 looks byte-swapped: big-endian GGUF is not supported",
                        r->what, v);
    if (v != 2 && v != 3)
        return jlm_errf(r->err, JLM_EVERSION,
                        "%s: GGUF version %u at offset 4 is not supported (only 2 and 3)", r->what, v);
    p->version = v;
    uint64_t at = r->pos;
    if ((rc = rd_uint(r, 8, &p->n_tensors, "n_tensors")) || (rc = rd_uint(r, 8, &p->n_kv, "n_kv")))
        return rc;
    if (p->n_kv > rd_left(r) / MIN_KV_BYTES || p->n_tensors > rd_left(r) / MIN_TI_BYTES)
        return jlm_errf(r->err, JLM_EFORMAT,
                        "%s: header: count n_tensors %" PRIu64 " / n_kv %" PRIu64 " at offset %" PRIu64
                        " cannot fit in the %" PRIu64 " bytes left",
                        r->what, p->n_tensors, p->n_kv, at, rd_left(r));
    return 0;
}

static int rd_kvs(rd *r, part *p)
{
    p->kv = ar_alloc(r->ar, p->n_kv * sizeof *p->kv);   /* n_kv <= len / 13 */
    if (!p->kv || hidx_init(&p->kv_idx, p->kv, sizeof *p->kv, p->n_kv))
        return jlm_errf(r->err, JLM_ENOMEM, "%s: table of %" PRIu64 " kv pairs", r->what, p->n_kv);
    memset(p->kv, 0, p->n_kv * sizeof *p->kv);
    for (uint64_t i = 0; i < p->n_kv; i++) {
        int rc = rd_kv(r, i, &p->kv[i]);
        if (rc)
            return rc;
        int64_t first = hidx_add(&p->kv_idx, i);
        if (first >= 0)
            return jlm_errf(r->err, JLM_EFORMAT, "%s: %s: duplicate key (first at kv %" PRId64 ")",
                            r->what, r->ctx, first);
    }
    return 0;
}

/* general.alignment: any integer type, a nonzero power of two; default 32. */
static int part_alignment(rd *r, part *p)
{
    p->alignment = DEFAULT_ALIGN;
    const jlm_gguf_kv *kv = hidx_find(&p->kv_idx, "general.alignment");
    if (!kv)
        return 0;
    if (!vtype_is_int(kv->type))
        return jlm_errf(r->err, JLM_EFORMAT, "%s: general.alignment has type %s, expected an integer",
                        r->what, vtype_name(kv->type));
    if (vtype_is_signed(kv->type) && kv->v.i < 0)
        return jlm_errf(r->err, JLM_EFORMAT, "%s: general.alignment %" PRId64 " is negative",
                        r->what, kv->v.i);
    uint64_t a = kv->v.u;
    if (a == 0 || (a & (a - 1)))
        return jlm_errf(r->err, JLM_EFORMAT,
                        "%s: general.alignment %" PRIu64 " is not a nonzero power of two", r->what, a);
    p->alignment = a;
    return 0;
}

/* n_dims, ne[], type, offset; computes n_bytes (overflow-safe). data_off
 * holds the offset relative to the data section until rd_tensors ends. */
static int rd_shape(rd *r, jlm_gguf_tensor *t, uint64_t align)
{
    uint64_t at = r->pos;
    int rc = rd_u32(r, &t->n_dims, "n_dims");
    if (rc)
        return rc;
    if (t->n_dims < 1 || t->n_dims > 4)
        return jlm_errf(r->err, JLM_EFORMAT, "%s: %s: n_dims %u at offset %" PRIu64 " is not in 1..4",
                        r->what, r->ctx, t->n_dims, at);
    uint64_t nel = 1;
    for (uint32_t d = 0; d < 4; d++) {
        t->ne[d] = 1;
        if (d < t->n_dims && (rc = rd_uint(r, 8, &t->ne[d], "ne")))
            return rc;
        if (t->ne[d] > INT64_MAX || (t->ne[d] && nel > INT64_MAX / t->ne[d]))
            return jlm_errf(r->err, JLM_EFORMAT,
                            "%s: %s: ne[%u] = %" PRIu64 " at offset %" PRIu64 ": element count overflows int64",
                            r->what, r->ctx, d, t->ne[d], r->pos - 8);
        nel *= t->ne[d];
    }
    at = r->pos;
    if ((rc = rd_u32(r, &t->type, "type")))
        return rc;
    uint64_t be = jlm_ggml_block_elems(t->type), bb = jlm_ggml_block_bytes(t->type);
    if (!be || !bb)
        return jlm_errf(r->err, JLM_EFORMAT, "%s: %s: unknown ggml type id %u at offset %" PRIu64,
                        r->what, r->ctx, t->type, at);
    if (t->ne[0] % be)
        return jlm_errf(r->err, JLM_EFORMAT,
                        "%s: %s: ne[0] = %" PRIu64 " is not a multiple of the block size %" PRIu64 " of type %u",
                        r->what, r->ctx, t->ne[0], be, t->type);
    if (nel / be > UINT64_MAX / bb)
        return jlm_errf(r->err, JLM_EFORMAT, "%s: %s: byte size overflows", r->what, r->ctx);
    t->n_bytes = nel / be * bb;
    at = r->pos;
    if ((rc = rd_uint(r, 8, &t->data_off, "offset")))
        return rc;
    if (t->data_off % align)
        return jlm_errf(r->err, JLM_EFORMAT,
                        "%s: %s: data offset %" PRIu64 " (field at offset %" PRIu64
                        ") is not a multiple of the alignment %" PRIu64,
                        r->what, r->ctx, t->data_off, at, align);
    return 0;
}

static int rd_tensors(rd *r, part *p)
{
    if (p->n_tensors > rd_left(r) / MIN_TI_BYTES)
        return jlm_errf(r->err, JLM_EFORMAT,
                        "%s: n_tensors %" PRIu64 " cannot fit in the %" PRIu64 " bytes left at offset %" PRIu64,
                        r->what, p->n_tensors, rd_left(r), r->pos);
    p->tensors = ar_alloc(r->ar, p->n_tensors * sizeof *p->tensors);
    if (!p->tensors || hidx_init(&p->t_idx, p->tensors, sizeof *p->tensors, p->n_tensors))
        return jlm_errf(r->err, JLM_ENOMEM, "%s: table of %" PRIu64 " tensors", r->what, p->n_tensors);
    memset(p->tensors, 0, p->n_tensors * sizeof *p->tensors);
    for (uint64_t i = 0; i < p->n_tensors; i++) {
        jlm_gguf_tensor *t = &p->tensors[i];
        snprintf(r->ctx, sizeof r->ctx, "tensor %" PRIu64, i);
        int rc = rd_str(r, &t->name, "name", 1);
        if (rc)
            return rc;
        snprintf(r->ctx, sizeof r->ctx, "tensor '%.120s'", t->name.s);
        int64_t first = hidx_add(&p->t_idx, i);
        if (first >= 0)
            return jlm_errf(r->err, JLM_EFORMAT, "%s: %s: duplicate tensor name (first is tensor %" PRId64 ")",
                            r->what, r->ctx, first);
        if ((rc = rd_shape(r, t, p->alignment)))
            return rc;
    }
    return 0;
}

/* Data section = alignUp(end of infos); every span must lie in the file. */
static int place_tensors(rd *r, part *p)
{
    uint64_t a = p->alignment, end = r->pos;
    if (end > UINT64_MAX - (a - 1))
        return jlm_errf(r->err, JLM_EFORMAT, "%s: data section start overflows", r->what);
    uint64_t data = (end + a - 1) & ~(a - 1);
    for (uint64_t i = 0; i < p->n_tensors; i++) {
        jlm_gguf_tensor *t = &p->tensors[i];
        uint64_t rel = t->data_off;
        if (rel > UINT64_MAX - data || t->n_bytes > UINT64_MAX - data - rel || data + rel + t->n_bytes > p->len)
            return jlm_errf(r->err, JLM_EFORMAT,
                            "%s: tensor '%s': data [%" PRIu64 ", %" PRIu64 ") past end of file (%" PRIu64 " bytes)",
                            r->what, t->name.s, data + rel, data + rel + t->n_bytes, p->len);
        t->data_off = data + rel;
    }
    return 0;
}

/* Parses one file image; the reader's buffer is freed by the caller. */
static int parse_part(rd *r, part *p)
{
    memset(p, 0, sizeof *p);
    p->len = r->len;
    int rc = rd_header(r, p);
    if (!rc)
        rc = rd_kvs(r, p);
    if (!rc)
        rc = part_alignment(r, p);
    if (!rc)
        rc = rd_tensors(r, p);
    if (!rc)
        rc = place_tensors(r, p);
    if (rc)
        part_free_idx(p);
    return rc;
}

/* ======================================================================
 * The handle
 * ==================================================================== */

typedef struct gpriv {
    arena          ar;
    hidx           kv_idx;      /* over g->kv (part 1) */
    hidx           t_idx;       /* over g->tensors (all parts) */
    uint32_t       n_fds;
    int           *fds;         /* one per part; NULL for an in-memory image */
    char         **paths;       /* one per part, for messages */
    const uint8_t *mem;
    jlm_gguf_reader vread;      /* virtual handle: reads go here */
    void          *vctx;
    void         (*vfree)(void *);
    int            root_fd;     /* jlm_gguf_open_at: paths are below it; else -1 */
} gpriv;

void jlm_gguf_close(jlm_gguf *g)
{
    if (!g)
        return;
    gpriv *pv = g->priv;
    if (pv) {
        for (uint32_t i = 0; i < pv->n_fds; i++)
            if (pv->fds[i] >= 0)
                close(pv->fds[i]);
        free(pv->fds);
        if (pv->vfree)
            pv->vfree(pv->vctx);
        free(pv->kv_idx.slot);
        free(pv->t_idx.slot);
        ar_free(&pv->ar);
        free(pv);
    }
    free(g->path);
    free(g);
}

static int new_handle(const char *name, uint32_t n_parts, jlm_gguf **out, jlm_err *err)
{
    jlm_gguf *g = calloc(1, sizeof *g);
    gpriv *pv = calloc(1, sizeof *pv);
    if (g)
        g->priv = pv;
    if (!g || !pv || !(g->path = strdup(name)) ||
        !(pv->paths = ar_alloc(&pv->ar, n_parts * sizeof *pv->paths))) {
        jlm_gguf_close(g);
        if (!g)
            free(pv);
        return jlm_errf(err, JLM_ENOMEM, "%s: handle", name);
    }
    g->n_parts = n_parts;
    pv->root_fd = -1;
    *out = g;
    return 0;
}

/* Takes part 1's metadata; the kv index moves into the handle. */
static void adopt_first(jlm_gguf *g, part *p)
{
    gpriv *pv = g->priv;
    g->version = p->version;
    g->n_kv = p->n_kv;
    g->kv = p->kv;
    g->alignment = p->alignment;
    pv->kv_idx = p->kv_idx;   /* shared: the caller drops p's pointer, never frees it */
}

int jlm_gguf_open_mem(const void *buf, size_t len, const char *what, jlm_gguf **out, jlm_err *err)
{
    if (!buf && len)
        return jlm_errf(err, JLM_EINVAL, "jlm_gguf_open_mem: NULL buffer of %zu bytes", len);
    what = what ? what : "<memory>";
    jlm_gguf *g;
    int rc = new_handle(what, 1, &g, err);
    if (rc)
        return rc;
    gpriv *pv = g->priv;
    rd r = { .what = what, .fd = -1, .buf = buf, .avail = len, .len = len, .err = err, .ar = &pv->ar };
    part p;
    if ((rc = parse_part(&r, &p))) {
        jlm_gguf_close(g);
        return rc;
    }
    const jlm_gguf_kv *sc = hidx_find(&p.kv_idx, "split.count");
    if (sc && vtype_is_int(sc->type) && sc->v.u != 1) {
        part_free_idx(&p);
        jlm_gguf_close(g);
        return jlm_errf(err, JLM_EUNSUPPORTED, "%s: split.count is %" PRIu64 ": split files open only from disk",
                        what, sc->v.u);
    }
    adopt_first(g, &p);   /* p's indexes now belong to the handle */
    g->n_tensors = p.n_tensors;
    g->tensors = p.tensors;
    pv->t_idx = p.t_idx;
    pv->mem = buf;
    pv->paths[0] = g->path;
    g->total_bytes = len;
    *out = g;
    return 0;
}

int jlm_gguf_virtual(const char *path, jlm_gguf_kv *kv, uint64_t n_kv, jlm_gguf_tensor *t, uint64_t n_t,
                     uint64_t total_bytes, jlm_gguf_reader read, void *ctx, void (*owner_free)(void *),
                     jlm_gguf **out, jlm_err *err)
{
    jlm_gguf *g;
    int rc = new_handle(path, 1, &g, err);
    if (rc) {
        owner_free(ctx);
        return rc;
    }
    gpriv *pv = g->priv;
    pv->vread = read;
    pv->vctx = ctx;
    pv->vfree = owner_free;
    pv->paths[0] = g->path;
    g->version = 3;
    g->alignment = DEFAULT_ALIGN;
    g->n_kv = n_kv;
    g->kv = kv;
    g->n_tensors = n_t;
    g->tensors = t;
    g->total_bytes = total_bytes;
    if (hidx_init(&pv->kv_idx, kv, sizeof *kv, n_kv) || hidx_init(&pv->t_idx, t, sizeof *t, n_t)) {
        jlm_gguf_close(g);
        return jlm_errf(err, JLM_ENOMEM, "%s: tables", path);
    }
    for (uint64_t i = 0; i < n_kv && !rc; i++)
        if (hidx_add(&pv->kv_idx, i) >= 0)
            rc = jlm_errf(err, JLM_EFORMAT, "%s: duplicate key '%s'", path, kv[i].key.s);
    for (uint64_t i = 0; i < n_t && !rc; i++)
        if (hidx_add(&pv->t_idx, i) >= 0)
            rc = jlm_errf(err, JLM_EFORMAT, "%s: duplicate tensor '%s'", path, t[i].name.s);
    if (rc) {
        jlm_gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

/* ======================================================================
 * Files and splits
 * ==================================================================== */

int jlm_gguf_fstat(const jlm_gguf *g, uint32_t k, struct stat *st)
{
    const gpriv *pv = g ? g->priv : NULL;
    if (!pv || !pv->fds || k >= pv->n_fds || pv->fds[k] < 0) {
        errno = EBADF;
        return -1;
    }
    return fstat(pv->fds[k], st);
}

/* Opens and parses one file; *fd_out stays open for jlm_gguf_read. */
static int open_part(int root_fd, const char *path, arena *ar, part *p, int *fd_out, jlm_err *err)
{
    /* O_NONBLOCK: a FIFO named like a GGUF is refused below, never waited on */
    int fl = O_RDONLY | O_CLOEXEC | O_NONBLOCK;
    int fd = root_fd >= 0 ? jlm_open_beneath(root_fd, path, fl, 0) : open(path, fl);
    if (fd < 0)
        return jlm_errf(err, errno == ENOENT ? JLM_ENOTFOUND : JLM_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int rc = jlm_errf(err, JLM_EIO, "%s: %s", path, strerror(errno));
        close(fd);
        return rc;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return jlm_errf(err, JLM_EIO, "%s: not a regular file", path);
    }
    rd r = { .what = path, .fd = fd, .len = (uint64_t)st.st_size, .err = err, .ar = ar };
    int rc = parse_part(&r, p);
    free(r.own);
    if (rc) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return 0;
}

/* NAME-00001-of-00003.gguf -> prefix length, 1, 3. 0 if the name has no such tail. */
static int split_name(const char *path, size_t *prefix_len, uint32_t *no, uint32_t *count)
{
    static const char tail[] = "-#####-of-#####.gguf";
    size_t n = strlen(path), t = sizeof tail - 1;
    if (n < t)
        return 0;
    const char *s = path + n - t;
    uint32_t a = 0, b = 0;
    for (size_t i = 0; i < t; i++) {
        if (tail[i] != '#') {
            if (s[i] != tail[i])
                return 0;
        } else if (s[i] < '0' || s[i] > '9') {
            return 0;
        } else if (i < 6) {
            a = a * 10 + (uint32_t)(s[i] - '0');
        } else {
            b = b * 10 + (uint32_t)(s[i] - '0');
        }
    }
    *prefix_len = n - t;
    *no = a;
    *count = b;
    return 1;
}

/* Integer value of key, or 1 if absent; -1 if not an integer in int64. */
static int kv_int(const part *p, const char *key, int64_t *v)
{
    const jlm_gguf_kv *kv = hidx_find(&p->kv_idx, key);
    if (!kv)
        return 1;
    if (!vtype_is_int(kv->type) || (!vtype_is_signed(kv->type) && kv->v.u > INT64_MAX))
        return -1;
    *v = kv->v.i;
    return 0;
}

/* split.count / split.no / split.tensors.count of part k (1-based) of n. */
static int check_split_keys(const char *path, const part *p, uint32_t k, uint32_t n,
                            uint64_t total_tensors, jlm_err *err)
{
    int64_t cnt = 0, no = 0, nt = 0;
    int cnt_rc = kv_int(p, "split.count", &cnt), no_rc = kv_int(p, "split.no", &no);
    int nt_rc = kv_int(p, "split.tensors.count", &nt);   /* each: 0 found, 1 absent, -1 bad */
    if (cnt_rc < 0 || no_rc < 0 || nt_rc < 0)
        return jlm_errf(err, JLM_EFORMAT, "%s: split.count / split.no / split.tensors.count must be integers", path);
    if (n == 1 && cnt_rc == 0 && cnt != 1)
        return jlm_errf(err, JLM_EFORMAT,
                        "%s: split.count is %" PRId64 " but the name is not PREFIX-00001-of-%05" PRId64 ".gguf",
                        path, cnt, cnt);
    if (n > 1 && (cnt_rc == 1 || no_rc == 1 || (k == 1 && nt_rc == 1)))
        return jlm_errf(err, JLM_EFORMAT,
                        "%s: split part %u of %u lacks split.count, split.no or split.tensors.count",
                        path, k, n);
    if (cnt_rc == 0 && cnt != (int64_t)n)
        return jlm_errf(err, JLM_EFORMAT, "%s: split.count is %" PRId64 ", the file name says %u parts",
                        path, cnt, n);
    if (no_rc == 0 && no != (int64_t)k - 1)
        return jlm_errf(err, JLM_EFORMAT, "%s: split.no is %" PRId64 ", expected %u for part %u (0-based)",
                        path, no, k - 1, k);
    if (nt_rc == 0 && (nt < 0 || (uint64_t)nt != total_tensors))
        return jlm_errf(err, JLM_EFORMAT, "%s: split.tensors.count is %" PRId64 ", the parts hold %" PRIu64 " tensors",
                        path, nt, total_tensors);
    return 0;
}

/* Concatenates the parts' tensors (part index set), refusing duplicate names. */
static int merge_tensors(jlm_gguf *g, part *parts, jlm_err *err)
{
    gpriv *pv = g->priv;
    uint64_t total = 0;
    for (uint32_t k = 0; k < g->n_parts; k++)
        total += parts[k].n_tensors;   /* each <= its file length / 32: no overflow */
    jlm_gguf_tensor *t = ar_alloc(&pv->ar, total * sizeof *t);
    if (!t || hidx_init(&pv->t_idx, t, sizeof *t, total))
        return jlm_errf(err, JLM_ENOMEM, "%s: table of %" PRIu64 " tensors", g->path, total);
    uint64_t j = 0;
    for (uint32_t k = 0; k < g->n_parts; k++) {
        for (uint64_t i = 0; i < parts[k].n_tensors; i++, j++) {
            t[j] = parts[k].tensors[i];
            t[j].part = k;
            int64_t first = hidx_add(&pv->t_idx, j);
            if (first >= 0)
                return jlm_errf(err, JLM_EFORMAT, "%s: tensor '%s' is in part %u and again in part %u",
                                pv->paths[k], t[j].name.s, t[first].part + 1, k + 1);
        }
    }
    g->tensors = t;
    g->n_tensors = total;
    return 0;
}

/* Opens parts 2..n next to part 1 (already parsed into parts[0]). */
static int open_other_parts(jlm_gguf *g, part *parts, size_t prefix_len, jlm_err *err)
{
    gpriv *pv = g->priv;
    for (uint32_t k = 2; k <= g->n_parts; k++) {
        size_t n = prefix_len + 24;
        char *path = ar_alloc(&pv->ar, n);
        if (!path)
            return jlm_errf(err, JLM_ENOMEM, "%s: part name", g->path);
        snprintf(path, n, "%.*s-%05u-of-%05u.gguf", (int)prefix_len, g->path, k, g->n_parts);
        pv->paths[k - 1] = path;
        int rc = open_part(pv->root_fd, path, &pv->ar, &parts[k - 1], &pv->fds[k - 1], err);
        if (rc == JLM_ENOTFOUND)
            return jlm_errf(err, rc, "%s: split part %u of %u is missing: %s", g->path, k, g->n_parts, path);
        if (rc)
            return rc;
    }
    return 0;
}

static int open_split(jlm_gguf *g, part *parts, size_t prefix_len, jlm_err *err)
{
    gpriv *pv = g->priv;
    int rc = open_other_parts(g, parts, prefix_len, err);
    if (!rc)
        rc = merge_tensors(g, parts, err);
    for (uint32_t k = 0; !rc && k < g->n_parts; k++)
        rc = check_split_keys(pv->paths[k], &parts[k], k + 1, g->n_parts, g->n_tensors, err);
    for (uint32_t k = 0; !rc && k < g->n_parts; k++)
        g->total_bytes += parts[k].len;
    return rc;
}

int jlm_gguf_open(const char *path, jlm_gguf **out, jlm_err *err)
{
    return jlm_gguf_open_at(-1, path, out, err);
}

int jlm_gguf_open_at(int root_fd, const char *path, jlm_gguf **out, jlm_err *err)
{
    if (!path)
        return jlm_errf(err, JLM_EINVAL, "jlm_gguf_open: NULL path");
    size_t prefix_len = 0;
    uint32_t no = 1, count = 1;
    if (split_name(path, &prefix_len, &no, &count) && (no < 1 || count < 1 || no > count))
        return jlm_errf(err, JLM_EFORMAT, "%s: split name says part %u of %u", path, no, count);
    if (no != 1)
        return jlm_errf(err, JLM_EINVAL, "%s: is part %u of a %u-part split; open part 1 (%.*s-00001-of-%05u.gguf)",
                        path, no, count, (int)prefix_len, path, count);
    jlm_gguf *g;
    int rc = new_handle(path, count, &g, err);
    if (rc)
        return rc;
    gpriv *pv = g->priv;
    part *parts = calloc(count, sizeof *parts);
    pv->fds = malloc(count * sizeof *pv->fds);
    if (!parts || !pv->fds) {
        free(parts);
        jlm_gguf_close(g);
        return jlm_errf(err, JLM_ENOMEM, "%s: %u parts", path, count);
    }
    for (uint32_t k = 0; k < count; k++)
        pv->fds[k] = -1;
    pv->n_fds = count;
    pv->paths[0] = g->path;
    pv->root_fd = root_fd;
    rc = open_part(root_fd, path, &pv->ar, &parts[0], &pv->fds[0], err);
    if (!rc)
        adopt_first(g, &parts[0]);
    if (!rc)
        rc = open_split(g, parts, prefix_len, err);
    if (pv->kv_idx.slot)
        parts[0].kv_idx.slot = NULL;   /* adopted: the handle frees it */
    for (uint32_t k = 0; k < count; k++)
        part_free_idx(&parts[k]);
    free(parts);
    if (rc) {
        jlm_gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

/* ======================================================================
 * Lookups, getters, reads
 * ==================================================================== */

const jlm_gguf_kv *jlm_gguf_find(const jlm_gguf *g, const char *key)
{
    return g ? hidx_find(&((const gpriv *)g->priv)->kv_idx, key) : NULL;
}

const jlm_gguf_tensor *jlm_gguf_find_tensor(const jlm_gguf *g, const char *name)
{
    return g ? hidx_find(&((const gpriv *)g->priv)->t_idx, name) : NULL;
}

static int get_kv(const jlm_gguf *g, const char *key, const jlm_gguf_kv **kv, jlm_err *err)
{
    *kv = jlm_gguf_find(g, key);
    if (!*kv)
        return jlm_errf(err, JLM_ENOTFOUND, "%s: key '%s' not found", g ? g->path : "?", key ? key : "(null)");
    return 0;
}

static int wrong_type(const jlm_gguf *g, const jlm_gguf_kv *kv, const char *want, jlm_err *err)
{
    return jlm_errf(err, JLM_EFORMAT, "%s: key '%s' has type %s, expected %s", g->path, kv->key.s,
                    vtype_name(kv->type), want);
}

static int out_of_range(const jlm_gguf *g, const jlm_gguf_kv *kv, const char *want, jlm_err *err)
{
    if (vtype_is_signed(kv->type))
        return jlm_errf(err, JLM_EFORMAT, "%s: key '%s' = %" PRId64 " does not fit in %s", g->path,
                        kv->key.s, kv->v.i, want);
    return jlm_errf(err, JLM_EFORMAT, "%s: key '%s' = %" PRIu64 " does not fit in %s", g->path,
                    kv->key.s, kv->v.u, want);
}

int jlm_gguf_get_u32(const jlm_gguf *g, const char *key, uint32_t *out, jlm_err *err)
{
    const jlm_gguf_kv *kv;
    int rc = get_kv(g, key, &kv, err);
    if (rc)
        return rc;
    if (!vtype_is_int(kv->type))
        return wrong_type(g, kv, "an integer", err);
    if (vtype_is_signed(kv->type) ? (kv->v.i < 0 || kv->v.i > UINT32_MAX) : kv->v.u > UINT32_MAX)
        return out_of_range(g, kv, "u32", err);
    *out = (uint32_t)kv->v.u;
    return 0;
}

int jlm_gguf_get_i64(const jlm_gguf *g, const char *key, int64_t *out, jlm_err *err)
{
    const jlm_gguf_kv *kv;
    int rc = get_kv(g, key, &kv, err);
    if (rc)
        return rc;
    if (!vtype_is_int(kv->type))
        return wrong_type(g, kv, "an integer", err);
    if (!vtype_is_signed(kv->type) && kv->v.u > INT64_MAX)
        return out_of_range(g, kv, "i64", err);
    *out = kv->v.i;
    return 0;
}

int jlm_gguf_get_f32(const jlm_gguf *g, const char *key, float *out, jlm_err *err)
{
    const jlm_gguf_kv *kv;
    int rc = get_kv(g, key, &kv, err);
    if (rc)
        return rc;
    if (kv->type != GGUF_T_F32 && kv->type != GGUF_T_F64)
        return wrong_type(g, kv, "f32 or f64", err);
    *out = (float)kv->v.f;
    return 0;
}

int jlm_gguf_get_bool(const jlm_gguf *g, const char *key, int *out, jlm_err *err)
{
    const jlm_gguf_kv *kv;
    int rc = get_kv(g, key, &kv, err);
    if (rc)
        return rc;
    if (kv->type != GGUF_T_BOOL)
        return wrong_type(g, kv, "bool", err);
    *out = kv->v.b;
    return 0;
}

int jlm_gguf_get_str(const jlm_gguf *g, const char *key, jlm_gguf_str *out, jlm_err *err)
{
    const jlm_gguf_kv *kv;
    int rc = get_kv(g, key, &kv, err);
    if (rc)
        return rc;
    if (kv->type != GGUF_T_STRING)
        return wrong_type(g, kv, "string", err);
    *out = kv->v.str;
    return 0;
}

int jlm_gguf_read(const jlm_gguf *g, const jlm_gguf_tensor *t, uint64_t off, void *buf, size_t n, jlm_err *err)
{
    if (!g || !t || t < g->tensors || t >= g->tensors + g->n_tensors || (!buf && n))
        return jlm_errf(err, JLM_EINVAL, "jlm_gguf_read: tensor not of this handle");
    const gpriv *pv = g->priv;
    if (off > t->n_bytes || n > t->n_bytes - off)
        return jlm_errf(err, JLM_EINVAL, "%s: tensor '%s': read [%" PRIu64 ", +%zu) past its %" PRIu64 " bytes",
                        pv->paths[t->part], t->name.s, off, n, t->n_bytes);
    if (pv->vread)
        return pv->vread(pv->vctx, (uint64_t)(t - g->tensors), off, buf, n, err);
    uint64_t at = t->data_off + off;   /* inside the part file: checked at open */
    if (pv->mem) {
        memcpy(buf, pv->mem + at, n);
        return 0;
    }
    size_t done;
    int e = jlm_io_pread_full(NULL, pv->fds[t->part], buf, n, at, &done);
    if (e)
        return jlm_errf(err, JLM_EIO, "%s: tensor '%s': read at offset %" PRIu64 ": %s",
                        pv->paths[t->part], t->name.s, at + done, jlm_io_strerror(e));
    return 0;
}

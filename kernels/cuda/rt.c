/* rt.c - the CUDA backend's device seam (rt.h): the CUDA runtime when built
 * with it (-DJLM_CUDA), and the strict host emulation, always. */
#include "kernels/cuda/rt.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/jlm_err.h"
#include "format/jlm_format.h"
#include "kernels/cuda/cuda.h"

#ifdef JLM_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---------------------------------------------------------------- the emulation's state */

typedef struct emu_alloc {
    uint8_t *p;
    uint64_t n;
    int      pinned;   /* 0: device memory; 1: pinned host memory */
    int      wr_stream;   /* device memory: the stream of the last copy into it */
    uint64_t wr_id;       /* ... and that copy's op number (0: never written by a copy) */
} emu_alloc;

enum { OP_COPY, OP_RECORD, OP_WAIT, OP_MATVEC, OP_KERNEL, OP_STAMP };

/* A whole block's kernels (everything but the matvec): the arguments of one
 * launch, and the device spans it reads (checked for ordering when it runs). */
enum { K_QUANT, K_RMS, K_ROPE, K_ELEM, K_ATTN, K_COMB, K_F16, K_Q8, K_STORE, K_ROPE_ROWS, K_ADD_ROWS, K_ATTN_ROWS };
#define EMU_READS 5
typedef struct emu_kern {
    int          kind, op;
    float       *out, *scores;
    const float *a, *w;
    const void  *b, *c;   /* attention: keys and values (halves or floats) */
    uint64_t     n;
    uint32_t     rows, n_head, hd;
    int64_t      pos;
    float        s, lim;
    jlm_cu_act   act;
    jlm_cu_rope  rope;
    jlm_cu_attn  attn;
    jlm_cu_rows  rws;     /* the *_ROWS kinds */
    uint64_t     n_pos;   /* K_ATTN_ROWS: the cache's positions from b, c */
    uint64_t     stride;  /* K_RMS: floats from a row to the next (0: n) */
    const uint32_t *dpos;        /* K_STORE: the row's position, read when it runs */
    uint64_t     row_bytes, cap; /* K_STORE: a row's bytes, the cache's bytes from out */
    struct { const void *p; uint64_t n; const char *what; } rd[EMU_READS];
} emu_kern;

typedef struct emu_op {
    int            kind, ev;
    uint64_t       id;           /* every op's number, in issue order across streams */
    uint64_t       seq;          /* RECORD: this record's number (its id); WAIT: the record waited for */
    int            ev_stream;    /* WAIT: the stream that record is on */
    uint64_t       host_seen[JLM_CU_NSTREAM];   /* what the host had waited for when it issued the op */
    uint8_t       *dst;
    const uint8_t *src;          /* COPY: read when the op runs (pinned or device source) */
    uint8_t       *snap;         /* COPY: the pageable source, taken at the call */
    uint64_t       n;
    uint64_t       rows, dp, sp; /* COPY: rows of n bytes, dp and sp bytes apart (0 rows: one) */
    int            d2d;          /* COPY: device to device (counted as a launch) */
    jlm_cu_mat     m;            /* MATVEC: sheet 0 of the batch b */
    jlm_cu_batch   b;
    uint64_t       plane[3];     /* MATVEC: the qs, d and sc planes' bytes, every sheet's (checked at the launch) */
    const float   *x;
    const jlm_cu_act *xq;
    float         *y;
    emu_kern       kr;           /* KERNEL */
} emu_op;

typedef struct emu_queue {
    emu_op *v;
    size_t  head, n, cap;
} emu_queue;

typedef struct emu_event {
    int      stream;             /* of the latest record */
    uint64_t rec_seq, done_seq;  /* latest record queued; latest record run */
} emu_event;

/* The graphs (below): a taped segment of the compute stream's ops, and a
 * slot per segment ordinal of a token. */
struct tape_op;
typedef struct jlm_cu_tape {
    struct tape_op *v;
    size_t          n, cap;
} jlm_cu_tape;
typedef struct jlm_cu_graph {
    jlm_cu_tape t;
    int         captured;
    uint64_t    launches;   /* device: the launches and device copies captured (counted at each replay) */
#ifdef JLM_CUDA
    cudaGraphExec_t exec;
#endif
} jlm_cu_graph;
#define JLM_CU_NGRAPH 64

struct jlm_cu_rt {
    int        emulated;
    /* graphs (both): r->tmu held */
    pthread_mutex_t tmu;
    int          graph_ok, taping;   /* JLM_CUDA_GRAPH not 0; a token's compute ops are taped now */
    unsigned     ord;                /* the segment's ordinal in the token */
    jlm_cu_tape  cur;
    jlm_cu_graph g[JLM_CU_NGRAPH];
    jlm_cu_rt_count cnt;
    struct { const uint8_t *p; uint64_t n; } *pin;   /* pinned host buffers (a copy from one is a graph's) */
    size_t       npin, cappin;
    char       name[256];
    pthread_mutex_t mu;          /* emulation: the backend's copy thread and the graph's */
    /* emulation */
    emu_alloc *al;
    size_t     nal, capal;
    emu_queue  q[JLM_CU_NSTREAM];
    emu_event  ev[JLM_CU_NEV];
    uint64_t   seq;
    /* happens-before: seen[s][t] is the last op of stream t known complete
     * before stream s's current op (through events it waited for, or host
     * waits before the op was issued); host_seen[t], what the host has
     * waited for; last_id[t], stream t's last op issued */
    uint64_t   seen[JLM_CU_NSTREAM][JLM_CU_NSTREAM];
    uint64_t   host_seen[JLM_CU_NSTREAM], last_id[JLM_CU_NSTREAM];
    int        depth;            /* nested event waits: a cycle would recurse without end */
    int        fault;            /* a queued op found bad pointers: reported at the next sync */
    uint64_t   stamp_at[JLM_CU_NSTAMP];   /* OP_STAMP i ran at this host time (0: not yet) */
    uint64_t   launches;         /* jlm_cu_rt_launches */
    int        capturing;        /* device: a graph's capture is under way (r->tmu held): its launches ... */
    uint64_t   cap_launches;     /* ... counted here, not in launches */
#ifdef JLM_CUDA
    int          dev;
    cudaStream_t s[JLM_CU_NSTREAM];
    cudaEvent_t  e[JLM_CU_NEV];
    cudaEvent_t *ts;             /* (JLM_CU_NSTAMP,) timing events, made at their first stamp */
#endif
};

#define EMU_FAULT 1000   /* the emulation's error code */

/* A launch (or device copy) enqueued: jlm_cu_rt_launches; one captured
 * into a graph counts when the graph is launched (replay). */
static void counted(jlm_cu_rt *r)
{
    if (r->capturing)
        r->cap_launches++;
    else
        __atomic_add_fetch(&r->launches, 1, __ATOMIC_RELAXED);
}

uint64_t jlm_cu_rt_launches(const jlm_cu_rt *r) { return __atomic_load_n(&r->launches, __ATOMIC_RELAXED); }

/* The last error of the calling thread (as the CUDA runtime's own last
 * error is per thread): the backend's copy thread and the graph's thread
 * each read their own. */
static __thread char last_msg[320];

static int failf(jlm_cu_rt *r, int rc, const char *fmt, ...)
{
    (void)r;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_msg, sizeof last_msg, fmt, ap);
    va_end(ap);
    return rc;
}

/* The allocation holding [p, p+n) of the kind asked (pinned 0/1), or NULL. */
static const emu_alloc *emu_find(const jlm_cu_rt *r, const void *p, uint64_t n, int pinned)
{
    const uint8_t *q = p;
    for (size_t i = 0; i < r->nal; i++) {
        const emu_alloc *a = &r->al[i];
        if (a->pinned == pinned && q >= a->p && q <= a->p + a->n && n <= (uint64_t)(a->p + a->n - q))
            return a;
    }
    return NULL;
}

static int emu_dev(jlm_cu_rt *r, const void *p, uint64_t n, const char *what)
{
    if (n && !emu_find(r, p, n, 0))
        return failf(r, EMU_FAULT, "cuda emulation: %s: %llu bytes at %p are not inside one device allocation",
                     what, (unsigned long long)n, p);
    return 0;
}

static int emu_push(jlm_cu_rt *r, int s, const emu_op *op)
{
    emu_queue *q = &r->q[s];
    if (q->head == q->n)
        q->head = q->n = 0;
    if (q->n == q->cap) {
        size_t c = q->cap ? q->cap * 2 : 64;
        emu_op *v = realloc(q->v, c * sizeof *v);
        if (!v)
            return failf(r, EMU_FAULT, "cuda emulation: out of memory for the stream queue");
        q->v = v;
        q->cap = c;
    }
    emu_op o = *op;
    o.id = ++r->seq;
    memcpy(o.host_seen, r->host_seen, sizeof o.host_seen);
    if (o.kind == OP_RECORD) {
        o.seq = o.id;
        r->ev[o.ev].stream = s;
        r->ev[o.ev].rec_seq = o.id;
    }
    r->last_id[s] = o.id;
    q->v[q->n++] = o;
    if (o.kind == OP_KERNEL || o.kind == OP_MATVEC || o.d2d)
        counted(r);   /* a launch or a device copy queued */
    return 0;
}

static void see(uint64_t *a, uint64_t v)
{
    if (*a < v)
        *a = v;
}

/* A kernel on stream s reads [p, p+n) of device memory: the last copy into
 * that allocation from another stream must be ordered before it (an event
 * the stream waited for, or a host wait before the launch was issued), or
 * the device could run the kernel before the copy lands. */
static int emu_ordered(jlm_cu_rt *r, int s, const void *p, uint64_t n, const char *what)
{
    const emu_alloc *a = n ? emu_find(r, p, n, 0) : NULL;
    if (a && a->wr_id && a->wr_stream != s && r->seen[s][a->wr_stream] < a->wr_id)
        return failf(r, EMU_FAULT, "cuda emulation: a kernel on stream %d reads %s that a copy on stream %d wrote "
                     "with no event between them", s, what, a->wr_stream);
    return 0;
}

static int emu_run_one(jlm_cu_rt *r, int s);
static int seg_before(jlm_cu_rt *r, int stream);
static void tape_free(jlm_cu_rt *r);

/* Runs stream s's ops until event ev's record `seq` has run. */
static int emu_until(jlm_cu_rt *r, int ev, uint64_t seq)
{
    if (++r->depth > 4) {
        r->depth--;
        return failf(r, EMU_FAULT, "cuda emulation: streams wait for each other in a cycle");
    }
    int rc = 0;
    while (!rc && r->ev[ev].done_seq < seq) {
        int s = r->ev[ev].stream;
        if (r->q[s].head == r->q[s].n) {
            rc = failf(r, EMU_FAULT, "cuda emulation: event %d record %llu never runs", ev, (unsigned long long)seq);
            break;
        }
        rc = emu_run_one(r, s);
    }
    r->depth--;
    return rc;
}

/* The jlm_cu_k_matvec grid on the host (harness.c), sheet by sheet, token by
 * token. The act records are read here, when the launch runs: they are device
 * memory that a queued copy may have filled. */
static int emu_matvec(jlm_cu_rt *r, int s, const emu_op *op)
{
    const jlm_cu_mat *m = &op->m;
    if (emu_ordered(r, s, m->qs, op->plane[0], "the qs plane") || emu_ordered(r, s, m->d, op->plane[1], "the d plane") ||
        emu_ordered(r, s, m->sc, op->plane[2], "the sc plane")) {
        r->fault = 1;
        return EMU_FAULT;
    }
    for (uint64_t i = 0; i < op->b.n * op->n; i++) {
        uint64_t h = i / op->n, t = i % op->n;
        const jlm_cu_act *a = op->xq ? &op->xq[h * op->b.rs + t] : NULL;
        jlm_cu_mat mh = jlm_cu_batch_sheet(m, &op->b, h);
        if (a && (a->k != m->k || emu_dev(r, a->q, m->k, "act codes") || emu_dev(r, a->d, m->k / 32 * 4, "act scales") ||
                  emu_dev(r, a->sum16, m->k / 16 * 2, "act sums"))) {
            if (a->k != m->k)
                failf(r, EMU_FAULT, "cuda emulation: token %llu's act record has k %llu, the matrix %llu",
                      (unsigned long long)t, (unsigned long long)a->k, (unsigned long long)m->k);
            r->fault = 1;
            return EMU_FAULT;
        }
        jlm_cu_grid_matvec(&mh, op->x ? op->x + t * op->b.tx + h * op->b.bx : NULL, a,
                           op->y + t * op->b.ty + h * op->b.by, jlm_cu_mv_warps((m->rows + 31) / 32 * op->n * op->b.n));
    }
    return 0;
}

/* kernel attn_rows: each row's span checked against the cache and the
 * scores' stride when it runs (the spans are device memory a queued copy
 * filled), then the one-row grid (harness.c) on the row's pointers. */
static int emu_attn_rows(jlm_cu_rt *r, const emu_kern *k)
{
    for (uint32_t y = 0; y < k->rws.n; y++) {
        uint64_t lo = k->rws.span[2 * y], n = k->rws.span[2 * y + 1];
        if (!n || n > k->attn.n_kv || lo + n > k->n_pos) {
            r->fault = 1;
            return failf(r, EMU_FAULT, "cuda emulation: attention row %u: keys [%llu, %llu) of a cache of %llu, most %llu",
                         y, (unsigned long long)lo, (unsigned long long)(lo + n), (unsigned long long)k->n_pos,
                         (unsigned long long)k->attn.n_kv);
        }
        const float *q = k->a;
        const void *kk = k->b, *vv = k->c;
        float *sc = k->scores, *out = k->out;
        jlm_cu_attn a = jlm_cu_attn_row(&k->attn, &k->rws, y, &q, &kk, &vv, &sc, &out);
        jlm_cu_host_attn(&a, q, kk, vv, sc, out);
    }
    return 0;
}

/* The bytes of keys and values attention p reads: to the last key's last
 * element, from the start of the first KV head (floats, halves or Q8_0
 * blocks). */
static void attn_bytes(const jlm_cu_attn *p, uint64_t *kn, uint64_t *vn)
{
    *kn = jlm_cu_kv_bytes(p->k_type, (p->n_head_kv - 1) * p->k_head_stride + (p->n_kv - 1) * p->k_stride + p->head_dim);
    *vn = jlm_cu_kv_bytes(p->v_type, (p->n_head_kv - 1) * p->v_head_stride + (p->n_kv - 1) * p->v_stride +
                                         p->head_dim_v);
}

static int emu_attn_spans(jlm_cu_rt *r, const jlm_cu_attn *p, const void *k, const void *v)
{
    uint64_t kn, vn;
    attn_bytes(p, &kn, &vn);
    return emu_dev(r, k, kn, "attention: keys at the device's position") ||
           emu_dev(r, v, vn, "attention: values at the device's position");
}

/* kernel kv_store: the row at *dpos, read now: it must lie inside the
 * cache the launch was given. */
static int emu_store(jlm_cu_rt *r, const emu_kern *k)
{
    uint64_t m = k->op == JLM_CU_KV_Q8_0 ? k->n / 32 : k->n, off = (uint64_t)*k->dpos * k->row_bytes;
    if (off > k->cap || jlm_cu_kv_bytes(k->op, k->n) > k->cap - off) {
        r->fault = 1;
        return failf(r, EMU_FAULT, "cuda emulation: cache store: row %u is past the %llu bytes of the cache",
                     *k->dpos, (unsigned long long)k->cap);
    }
    for (uint64_t i = 0; i < m; i++)
        jlm_cu_kv_store_at(k->op, (uint8_t *)(void *)k->out, k->row_bytes, k->dpos, k->a, i);
    return 0;
}

/* kernel attn: a key range read from the device now (dpos) has its spans
 * checked again, strictly. */
static int emu_attn(jlm_cu_rt *r, const emu_kern *k)
{
    jlm_cu_attn p = k->attn;
    const void *kk = k->b, *vv = k->c;
    jlm_cu_attn_at(&p, &kk, &vv);
    if (p.dpos && (p.n_kv > k->attn.n_kv || emu_attn_spans(r, &p, kk, vv))) {
        r->fault = 1;
        return p.n_kv > k->attn.n_kv ? failf(r, EMU_FAULT, "cuda emulation: attention: %llu keys at the device's "
                                             "position, the launch allows %llu", (unsigned long long)p.n_kv,
                                             (unsigned long long)k->attn.n_kv)
                                     : EMU_FAULT;
    }
    jlm_cu_host_attn(&p, k->a, kk, vv, k->scores, k->out);
    return 0;
}

/* One of a block's kernels, on the host: the bodies over the grid the
 * launchers of kernels.cu use (harness.c). */
static int emu_kernel(jlm_cu_rt *r, int s, const emu_kern *k)
{
    for (int i = 0; i < EMU_READS; i++)
        if (k->rd[i].p && emu_ordered(r, s, k->rd[i].p, k->rd[i].n, k->rd[i].what)) {
            r->fault = 1;
            return EMU_FAULT;
        }
    switch (k->kind) {
    case K_QUANT:
        for (uint64_t b = 0; b < k->act.k / 32; b++)
            jlm_cu_quantize_block(k->a, &k->act, b);
        break;
    case K_RMS:
        for (uint64_t i = 0, st = k->stride ? k->stride : k->n; i < k->rows; i++)
            jlm_cu_host_rmsnorm(k->out + i * st, k->a + i * st, k->w, k->n, k->s);
        break;
    case K_ROPE: {
        uint32_t half = k->rope.n_rot / 2;
        int64_t pos = jlm_cu_pos_at(k->rope.dpos, k->pos);
        for (uint64_t i = 0; half && i < (uint64_t)k->n_head * half; i++)
            jlm_cu_rope_pair(&k->rope, k->out, k->hd, pos, (uint32_t)(i / half), (uint32_t)(i % half));
        break;
    }
    case K_STORE: return emu_store(r, k);
    case K_ELEM: jlm_cu_host_elem(k->op, k->out, k->a, k->b, k->n, k->s, k->lim); break;
    case K_COMB: jlm_cu_host_moe_combine(k->out, k->b, k->w, k->rows, k->n); break;
    case K_F16: jlm_cu_host_to_f16((uint16_t *)(void *)k->out, k->a, k->n); break;
    case K_Q8: jlm_cu_host_kv_q8((uint8_t *)(void *)k->out, k->a, k->n); break;
    case K_ROPE_ROWS: {
        uint32_t half = k->rope.n_rot / 2;
        for (uint32_t y = 0; y < k->rws.n; y++)
            for (uint64_t i = 0; i < (uint64_t)k->n_head * half; i++)
                jlm_cu_rope_pair(&k->rope, k->out + y * k->rws.x_stride, k->hd, k->rws.pos[y], (uint32_t)(i / half),
                                 (uint32_t)(i % half));
        break;
    }
    case K_ADD_ROWS:
        for (uint64_t i = 0; i < k->rows * k->n; i++)
            k->out[i] = jlm_cu_elem(JLM_CU_ADD, k->a[i], k->w[i % k->n], 0.0f, 0.0f);
        break;
    case K_ATTN_ROWS: return emu_attn_rows(r, k);
    default: return emu_attn(r, k);
    }
    return 0;
}

static int emu_run_one(jlm_cu_rt *r, int s)
{
    emu_queue *q = &r->q[s];
    emu_op op = q->v[q->head++];
    int rc = 0;
    for (int t = 0; t < JLM_CU_NSTREAM; t++)
        see(&r->seen[s][t], op.host_seen[t]);
    switch (op.kind) {
    case OP_COPY: {
        for (uint64_t i = 1; i < op.rows; i++)
            memcpy(op.dst + i * op.dp, op.src + i * op.sp, op.n);
        memcpy(op.dst, op.snap ? op.snap : op.src, op.n);
        free(op.snap);
        emu_alloc *a = (emu_alloc *)emu_find(r, op.dst, op.n, 0);
        if (a) {
            a->wr_stream = s;
            a->wr_id = op.id;
        }
        break;
    }
    case OP_RECORD:
        if (r->ev[op.ev].done_seq < op.seq)
            r->ev[op.ev].done_seq = op.seq;
        break;
    case OP_WAIT:
        rc = emu_until(r, op.ev, op.seq);
        see(&r->seen[s][op.ev_stream], op.seq);
        for (int t = 0; t < JLM_CU_NSTREAM; t++)
            see(&r->seen[s][t], r->seen[op.ev_stream][t]);
        break;
    case OP_MATVEC:
        rc = emu_matvec(r, s, &op);
        break;
    case OP_KERNEL:
        rc = emu_kernel(r, s, &op.kr);
        break;
    case OP_STAMP: {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        r->stamp_at[op.ev] = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
        break;
    }
    }
    return rc;
}

static int emu_flush(jlm_cu_rt *r, int s)
{
    int rc = 0;
    while (!rc && r->q[s].head < r->q[s].n)
        rc = emu_run_one(r, s);
    if (!rc)
        see(&r->host_seen[s], r->last_id[s]);
    if (!rc && r->fault)
        rc = EMU_FAULT;
    r->fault = 0;
    return rc;
}

static int emu_flush_all(jlm_cu_rt *r)
{
    int rc = 0;
    for (int s = 0; s < JLM_CU_NSTREAM; s++) {
        int x = emu_flush(r, s);
        if (!rc)
            rc = x;
    }
    return rc;
}

static int emu_alloc_new(jlm_cu_rt *r, uint64_t n, int pinned, void **out)
{
    *out = NULL;
    if (r->nal == r->capal) {
        size_t c = r->capal ? r->capal * 2 : 32;
        emu_alloc *a = realloc(r->al, c * sizeof *a);
        if (!a)
            return failf(r, EMU_FAULT, "cuda emulation: out of memory");
        r->al = a;
        r->capal = c;
    }
    uint8_t *p = malloc(n ? n : 1);
    if (!p)
        return failf(r, EMU_FAULT, "cuda emulation: out of memory for %llu bytes", (unsigned long long)n);
    memset(p, pinned ? 0 : 0xA5, n);
    r->al[r->nal++] = (emu_alloc){.p = p, .n = n, .pinned = pinned};
    *out = p;
    return 0;
}

static void emu_alloc_free(jlm_cu_rt *r, void *p, int pinned)
{
    if (!p)
        return;
    emu_flush_all(r);
    for (size_t i = 0; i < r->nal; i++)
        if (r->al[i].p == p && r->al[i].pinned == pinned) {
            free(p);
            r->al[i] = r->al[--r->nal];
            return;
        }
    abort();   /* freeing what was never allocated: a backend bug */
}

/* ---------------------------------------------------------------- open / close */

int jlm_cu_rt_open(int device, int emulate, jlm_cu_rt **out, char *why, size_t why_len)
{
    *out = NULL;
    jlm_cu_rt *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(why, why_len, "out of memory");
        return JLM_ENOMEM;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->tmu, NULL);
    const char *g = getenv("JLM_CUDA_GRAPH");
    r->graph_ok = !(g && !strcmp(g, "0"));
    if (emulate) {
        r->emulated = 1;
        snprintf(r->name, sizeof r->name, "host emulation (JLM_CUDA_EMULATE)");
        *out = r;
        return 0;
    }
#ifdef JLM_CUDA
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        snprintf(why, why_len, "no CUDA device: cudaGetDeviceCount: %s (error %d)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no device", (int)e);
        cudaGetLastError();
        free(r);
        return JLM_EUNSUPPORTED;
    }
    if (device < 0 || device >= n) {
        snprintf(why, why_len, "--device %d: this machine has %d CUDA device(s)", device, n);
        free(r);
        return JLM_EINVAL;
    }
    struct cudaDeviceProp prop;
    if ((e = cudaSetDevice(device)) != cudaSuccess || (e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess) {
        snprintf(why, why_len, "device %d: %s (error %d)", device, cudaGetErrorString(e), (int)e);
        free(r);
        return JLM_EIO;
    }
    r->dev = device;
    snprintf(r->name, sizeof r->name, "%s", prop.name);
    for (int s = 0; s < JLM_CU_NSTREAM && e == cudaSuccess; s++)
        e = cudaStreamCreateWithFlags(&r->s[s], cudaStreamNonBlocking);
    for (int i = 0; i < JLM_CU_NEV && e == cudaSuccess; i++)
        e = cudaEventCreateWithFlags(&r->e[i], cudaEventDisableTiming);
    if (e != cudaSuccess) {
        snprintf(why, why_len, "device %d: streams and events: %s (error %d)", device, cudaGetErrorString(e), (int)e);
        jlm_cu_rt_close(r);
        return JLM_EIO;
    }
    *out = r;
    return 0;
#else
    (void)device;
    snprintf(why, why_len, "CUDA backend not built (no nvcc at build time, or make CUDA=0)");
    free(r);
    return JLM_EUNSUPPORTED;
#endif
}

void jlm_cu_rt_close(jlm_cu_rt *r)
{
    if (!r)
        return;
    seg_before(r, JLM_CU_NSTREAM);
    tape_free(r);
    if (r->emulated) {
        emu_flush_all(r);
        for (size_t i = 0; i < r->nal; i++)
            free(r->al[i].p);
        free(r->al);
        for (int s = 0; s < JLM_CU_NSTREAM; s++)
            free(r->q[s].v);
    }
#ifdef JLM_CUDA
    else {
        for (int s = 0; s < JLM_CU_NSTREAM; s++)
            if (r->s[s]) {
                cudaStreamSynchronize(r->s[s]);
                cudaStreamDestroy(r->s[s]);
            }
        for (int i = 0; i < JLM_CU_NEV; i++)
            if (r->e[i])
                cudaEventDestroy(r->e[i]);
        for (int i = 0; r->ts && i < JLM_CU_NSTAMP; i++)
            if (r->ts[i])
                cudaEventDestroy(r->ts[i]);
        free(r->ts);
    }
#endif
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->tmu);
    free(r);
}

int jlm_cu_rt_emulated(const jlm_cu_rt *r) { return r->emulated; }
const char *jlm_cu_rt_name(const jlm_cu_rt *r) { return r->name; }
const char *jlm_cu_rt_error(const jlm_cu_rt *r) { (void)r; return last_msg; }

#ifdef JLM_CUDA
static int cu(jlm_cu_rt *r, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return 0;
    cudaGetLastError();
    return failf(r, (int)e, "%s: %s (error %d)", what, cudaGetErrorString(e), (int)e);
}
#define DEVICE_CALL(call, what) \
    do { if (!r->emulated) return cu(r, (call), (what)); } while (0)
/* ... a device copy enqueued: counted (jlm_cu_rt_launches) */
#define DEVICE_CALL_COUNTED(call, what)              \
    do {                                             \
        if (!r->emulated) {                          \
            int rc_ = cu(r, (call), (what));         \
            if (!rc_)                                \
                counted(r);                          \
            return rc_;                              \
        }                                            \
    } while (0)
#else
#define DEVICE_CALL(call, what) \
    do { if (!r->emulated) return failf(r, EMU_FAULT, "%s: CUDA not built", (what)); } while (0)
#define DEVICE_CALL_COUNTED DEVICE_CALL
#endif

uint64_t jlm_cu_rt_free_bytes(const jlm_cu_rt *r)
{
#ifdef JLM_CUDA
    size_t fr = 0, tot = 0;
    if (!r->emulated && cudaMemGetInfo(&fr, &tot) == cudaSuccess)
        return fr;
#endif
    (void)r;
    return 0;
}

/* ---------------------------------------------------------------- memory */

/* The emulation's state is shared by the backend's two threads (the graph's
 * and its copy thread): every emulated call runs under r->mu. The CUDA
 * runtime is thread-safe itself; its calls take no lock here (a host wait on
 * one stream must not hold up the other thread's calls). */
#define EMU_LOCKED(call)                  \
    do {                                  \
        pthread_mutex_lock(&r->mu);       \
        int rc_ = (call);                 \
        pthread_mutex_unlock(&r->mu);     \
        return rc_;                       \
    } while (0)

int jlm_cu_rt_alloc(jlm_cu_rt *r, uint64_t n, void **dev)
{
    DEVICE_CALL(cudaMalloc(dev, (size_t)n), "cudaMalloc");
    EMU_LOCKED(emu_alloc_new(r, n, 0, dev));
}

void jlm_cu_rt_free(jlm_cu_rt *r, void *dev)
{
    seg_before(r, JLM_CU_NSTREAM);   /* taped launches may read it */
#ifdef JLM_CUDA
    if (!r->emulated) {
        if (dev)
            cudaFree(dev);
        return;
    }
#endif
    pthread_mutex_lock(&r->mu);
    emu_alloc_free(r, dev, 0);
    pthread_mutex_unlock(&r->mu);
}

static int pin_note(jlm_cu_rt *r, int rc, void *p, uint64_t n)
{
    pthread_mutex_lock(&r->tmu);
    if (!rc && r->npin == r->cappin) {
        size_t c = r->cappin ? r->cappin * 2 : 16;
        void *v = realloc(r->pin, c * sizeof *r->pin);
        if (v) {
            r->pin = v;
            r->cappin = c;
        }
    }
    if (!rc && r->npin < r->cappin) {   /* else not noted: its copies are issued, never taped */
        r->pin[r->npin].p = p;
        r->pin[r->npin++].n = n;
    }
    if (rc || !p)
        for (size_t i = 0; i < r->npin; i++)
            if (r->pin[i].p == p)
                r->pin[i] = r->pin[--r->npin];
    pthread_mutex_unlock(&r->tmu);
    return rc;
}

int jlm_cu_rt_host_alloc(jlm_cu_rt *r, uint64_t n, void **host)
{
#ifdef JLM_CUDA
    if (!r->emulated)
        return pin_note(r, cu(r, cudaHostAlloc(host, (size_t)n, cudaHostAllocDefault), "cudaHostAlloc"), *host, n);
#else
    DEVICE_CALL(0, "cudaHostAlloc");
#endif
    pthread_mutex_lock(&r->mu);
    int rc = emu_alloc_new(r, n, 1, host);
    pthread_mutex_unlock(&r->mu);
    return pin_note(r, rc, *host, n);
}

static void pin_forget(jlm_cu_rt *r, const void *p)
{
    pthread_mutex_lock(&r->tmu);
    for (size_t i = 0; i < r->npin; i++)
        if (r->pin[i].p == p) {
            r->pin[i] = r->pin[--r->npin];
            break;
        }
    pthread_mutex_unlock(&r->tmu);
}

void jlm_cu_rt_host_free(jlm_cu_rt *r, void *host)
{
    seg_before(r, JLM_CU_NSTREAM);
    pin_forget(r, host);
#ifdef JLM_CUDA
    if (!r->emulated) {
        if (host) {
            cudaDeviceSynchronize();
            cudaFreeHost(host);
        }
        return;
    }
#endif
    pthread_mutex_lock(&r->mu);
    emu_alloc_free(r, host, 1);
    pthread_mutex_unlock(&r->mu);
}

/* ---------------------------------------------------------------- copies, events */

static int bad_stream(jlm_cu_rt *r, int s) { return s < 0 || s >= JLM_CU_NSTREAM ? failf(r, EMU_FAULT, "stream %d", s) : 0; }
static int bad_event(jlm_cu_rt *r, int e) { return e < 0 || e >= JLM_CU_NEV ? failf(r, EMU_FAULT, "event %d", e) : 0; }

static int emu_h2d(jlm_cu_rt *r, void *dev, const void *host, uint64_t n, int stream)
{
    if (!n)
        return 0;
    if (emu_dev(r, dev, n, "copy to the device: destination"))
        return EMU_FAULT;
    if (emu_find(r, host, 1, 0))
        return failf(r, EMU_FAULT, "cuda emulation: copy to the device: the source %p is device memory", host);
    emu_op op = {.kind = OP_COPY, .dst = dev, .n = n};
    if (emu_find(r, host, n, 1))
        op.src = host;   /* pinned: read when the copy runs */
    else if (!(op.snap = malloc(n)))
        return failf(r, EMU_FAULT, "cuda emulation: out of memory");
    else
        memcpy(op.snap, host, n);   /* pageable: consumed now */
    int rc = emu_push(r, stream, &op);
    if (rc)
        free(op.snap);
    return rc;
}

static int iss_h2d(jlm_cu_rt *r, void *dev, const void *host, uint64_t n, int stream)
{
    if (bad_stream(r, stream))
        return EMU_FAULT;
    DEVICE_CALL(cudaMemcpyAsync(dev, host, (size_t)n, cudaMemcpyHostToDevice, r->s[stream]), "cudaMemcpyAsync (to the device)");
    EMU_LOCKED(emu_h2d(r, dev, host, n, stream));
}

static int emu_d2h(jlm_cu_rt *r, void *host, const void *dev, uint64_t n, int stream)
{
    if (!n)
        return 0;
    if (emu_dev(r, dev, n, "copy to the host: source"))
        return EMU_FAULT;
    if (emu_find(r, host, 1, 0))
        return failf(r, EMU_FAULT, "cuda emulation: copy to the host: the destination %p is device memory", host);
    emu_op op = {.kind = OP_COPY, .dst = host, .src = dev, .n = n};
    return emu_push(r, stream, &op);
}

static int iss_d2h(jlm_cu_rt *r, void *host, const void *dev, uint64_t n, int stream)
{
    if (bad_stream(r, stream))
        return EMU_FAULT;
    DEVICE_CALL(cudaMemcpyAsync(host, dev, (size_t)n, cudaMemcpyDeviceToHost, r->s[stream]), "cudaMemcpyAsync (to the host)");
    EMU_LOCKED(emu_d2h(r, host, dev, n, stream));
}

static int emu_record(jlm_cu_rt *r, int ev, int stream)
{
    emu_op op = {.kind = OP_RECORD, .ev = ev};   /* numbered by emu_push */
    return emu_push(r, stream, &op);
}

int jlm_cu_rt_record(jlm_cu_rt *r, int ev, int stream)
{
    if (bad_stream(r, stream) || bad_event(r, ev) || seg_before(r, stream))
        return EMU_FAULT;
    DEVICE_CALL(cudaEventRecord(r->e[ev], r->s[stream]), "cudaEventRecord");
    EMU_LOCKED(emu_record(r, ev, stream));
}

static int emu_stamp(jlm_cu_rt *r, uint32_t i, int stream)
{
    emu_op op = {.kind = OP_STAMP, .ev = (int)i};
    r->stamp_at[i] = 0;
    return emu_push(r, stream, &op);
}

int jlm_cu_rt_stamp(jlm_cu_rt *r, uint32_t i, int stream)
{
    if (bad_stream(r, stream) || i >= JLM_CU_NSTAMP)
        return failf(r, EMU_FAULT, "stamp %u on stream %d", i, stream);
    if (seg_before(r, stream))
        return EMU_FAULT;
#ifdef JLM_CUDA
    if (!r->emulated) {
        if (!r->ts && !(r->ts = calloc(JLM_CU_NSTAMP, sizeof *r->ts)))
            return failf(r, EMU_FAULT, "timing events: out of memory");
        if (!r->ts[i] && cu(r, cudaEventCreate(&r->ts[i]), "cudaEventCreate (timing)"))
            return EMU_FAULT;
        return cu(r, cudaEventRecord(r->ts[i], r->s[stream]), "cudaEventRecord (timing)");
    }
#else
    DEVICE_CALL(0, "stamp");
#endif
    EMU_LOCKED(emu_stamp(r, i, stream));
}

static int emu_stamp_ns(jlm_cu_rt *r, uint32_t i, uint32_t j, uint64_t *ns)
{
    if (!r->stamp_at[i] || !r->stamp_at[j])
        return failf(r, EMU_FAULT, "cuda emulation: stamp %u or %u has not run", i, j);
    *ns = r->stamp_at[j] > r->stamp_at[i] ? r->stamp_at[j] - r->stamp_at[i] : 0;
    return 0;
}

int jlm_cu_rt_stamp_ns(jlm_cu_rt *r, uint32_t i, uint32_t j, uint64_t *ns)
{
    *ns = 0;
    if (i >= JLM_CU_NSTAMP || j >= JLM_CU_NSTAMP)
        return failf(r, EMU_FAULT, "stamps %u, %u", i, j);
#ifdef JLM_CUDA
    if (!r->emulated) {
        float ms = 0;
        if (!r->ts || !r->ts[i] || !r->ts[j])
            return failf(r, EMU_FAULT, "stamp %u or %u never recorded", i, j);
        int rc = cu(r, cudaEventElapsedTime(&ms, r->ts[i], r->ts[j]), "cudaEventElapsedTime");
        if (!rc)
            *ns = ms > 0 ? (uint64_t)((double)ms * 1e6) : 0;
        return rc;
    }
#else
    DEVICE_CALL(0, "stamp");
#endif
    EMU_LOCKED(emu_stamp_ns(r, i, j, ns));
}

static int emu_wait(jlm_cu_rt *r, int stream, int ev)
{
    if (!r->ev[ev].rec_seq)
        return 0;   /* never recorded: nothing to wait for (as CUDA) */
    emu_op op = {.kind = OP_WAIT, .ev = ev, .seq = r->ev[ev].rec_seq, .ev_stream = r->ev[ev].stream};
    return emu_push(r, stream, &op);
}

int jlm_cu_rt_wait(jlm_cu_rt *r, int stream, int ev)
{
    if (bad_stream(r, stream) || bad_event(r, ev) || seg_before(r, stream))
        return EMU_FAULT;
    DEVICE_CALL(cudaStreamWaitEvent(r->s[stream], r->e[ev], 0), "cudaStreamWaitEvent");
    EMU_LOCKED(emu_wait(r, stream, ev));
}

static int emu_event_sync(jlm_cu_rt *r, int ev)
{
    int rc = emu_until(r, ev, r->ev[ev].rec_seq);
    if (!rc)
        see(&r->host_seen[r->ev[ev].stream], r->ev[ev].rec_seq);
    if (!rc && r->fault)
        rc = EMU_FAULT;
    r->fault = 0;
    return rc;
}

int jlm_cu_rt_event_sync(jlm_cu_rt *r, int ev)
{
    if (bad_event(r, ev) || seg_before(r, -1))
        return EMU_FAULT;
    DEVICE_CALL(cudaEventSynchronize(r->e[ev]), "cudaEventSynchronize");
    EMU_LOCKED(emu_event_sync(r, ev));
}

int jlm_cu_rt_sync(jlm_cu_rt *r, int stream)
{
    if (bad_stream(r, stream) || seg_before(r, stream))
        return EMU_FAULT;
    DEVICE_CALL(cudaStreamSynchronize(r->s[stream]), "cudaStreamSynchronize");
    EMU_LOCKED(emu_flush(r, stream));
}

/* ---------------------------------------------------------------- matvec */

static int emu_launch(jlm_cu_rt *r, const jlm_cu_mat *m, const jlm_cu_batch *b, uint64_t n, const float *x,
                      const jlm_cu_act *xq, float *y, int stream)
{
    uint64_t ql, dl, sl, h1 = b->n - 1;
    jlm_err err = {0};
    if (jlm_fmt_planes(m->type, m->k, m->rows, &ql, &dl, &sl, &err))
        return failf(r, EMU_FAULT, "cuda emulation: matvec: %s", err.msg);
    int fl = jlm_fmt_type_traits(m->type)->is_float;
    ql += h1 * b->q, dl += dl ? h1 * b->d : 0, sl += sl ? h1 * b->s : 0;
    if (emu_dev(r, m->qs, ql, "matvec: qs plane") || emu_dev(r, m->d, dl, "matvec: d plane") ||
        emu_dev(r, m->sc, sl, "matvec: sc plane") ||
        emu_dev(r, y, ((n - 1) * b->ty + h1 * b->by + m->rows) * 4, "matvec: result"))
        return EMU_FAULT;
    if (fl ? !x : !xq)
        return failf(r, EMU_FAULT, "cuda emulation: matvec: no activations");
    if (fl ? emu_dev(r, x, ((n - 1) * b->tx + h1 * b->bx + m->k) * 4, "matvec: activations")
           : emu_dev(r, xq, (h1 * b->rs + n) * sizeof *xq, "matvec: act records"))
        return EMU_FAULT;
    emu_op op = {.kind = OP_MATVEC, .m = *m, .b = *b, .plane = {ql, dl, sl}, .n = n, .x = fl ? x : NULL,
                 .xq = fl ? NULL : xq, .y = y};
    return emu_push(r, stream, &op);
}

int jlm_cu_rt_matvec(jlm_cu_rt *r, const jlm_cu_mat *m, uint64_t n, const float *x, const jlm_cu_act *xq, float *y,
                     int stream)
{
    jlm_cu_batch b = {1, m->k, m->rows, 0, 0, 0, 0, 0, 0};
    return jlm_cu_rt_matvec_batch(r, m, &b, n, x, xq, y, stream);
}

static int iss_matvec(jlm_cu_rt *r, const jlm_cu_mat *m, const jlm_cu_batch *b, uint64_t n, const float *x,
                      const jlm_cu_act *xq, float *y, int stream)
{
    if (bad_stream(r, stream))
        return EMU_FAULT;
    if (!n || n > 65535 || !b->n || b->n > 65535 || b->q % 4 || b->d % 4 || b->s % 4 || (b->n > 1 && b->rs < n))
        return failf(r, EMU_FAULT, "matvec: %llu sheets of %llu tokens, strides %llu/%llu/%llu: not launchable",
                     (unsigned long long)b->n, (unsigned long long)n, (unsigned long long)b->q,
                     (unsigned long long)b->d, (unsigned long long)b->s);
#ifdef JLM_CUDA
    if (!r->emulated) {
        int rc = jlm_cu_launch_matvec_batch(m, b, n, x, xq, y, r->s[stream]);
        if (!rc)
            counted(r);
        return rc ? failf(r, rc, "matvec launch: %s (error %d)", jlm_cu_launch_error(rc), rc) : 0;
    }
#else
    DEVICE_CALL(0, "matvec launch");
#endif
    EMU_LOCKED(emu_launch(r, m, b, n, x, xq, y, stream));
}

/* ---------------------------------------------------------------- a whole block's kernels */

static int emu_d2d(jlm_cu_rt *r, void *dst, const void *src, uint64_t n, int stream)
{
    if (!n)
        return 0;
    if (emu_dev(r, dst, n, "device copy: destination") || emu_dev(r, src, n, "device copy: source"))
        return EMU_FAULT;
    emu_op op = {.kind = OP_COPY, .dst = dst, .src = src, .n = n, .d2d = 1};
    return emu_push(r, stream, &op);
}

static int iss_d2d(jlm_cu_rt *r, void *dst, const void *src, uint64_t n, int stream)
{
    if (bad_stream(r, stream))
        return EMU_FAULT;
    DEVICE_CALL_COUNTED(cudaMemcpyAsync(dst, src, (size_t)n, cudaMemcpyDeviceToDevice, r->s[stream]),
                "cudaMemcpyAsync (device to device)");
    EMU_LOCKED(emu_d2d(r, dst, src, n, stream));
}

/* Queues k after checking every span it touches: writes (out, scores) and
 * reads (rd[]) inside device allocations. */
static int emu_kernel_push(jlm_cu_rt *r, const emu_kern *k, uint64_t out_n, uint64_t scores_n, int stream)
{
    if (emu_dev(r, k->out, out_n, "kernel: output") || emu_dev(r, k->scores, scores_n, "kernel: scores"))
        return EMU_FAULT;
    for (int i = 0; i < EMU_READS; i++)
        if (k->rd[i].p && emu_dev(r, k->rd[i].p, k->rd[i].n, k->rd[i].what))
            return EMU_FAULT;
    emu_op op = {.kind = OP_KERNEL, .kr = *k};
    return emu_push(r, stream, &op);
}

#ifdef JLM_CUDA
#define LAUNCH(call, what)                                                                          \
    do {                                                                                            \
        if (!r->emulated) {                                                                         \
            int rc_ = (call);                                                                       \
            if (!rc_)                                                                               \
                counted(r);                                                                         \
            return rc_ ? failf(r, rc_, "%s launch: %s (error %d)", (what), jlm_cu_launch_error(rc_), rc_) : 0; \
        }                                                                                           \
    } while (0)
#else
#define LAUNCH(call, what) DEVICE_CALL(0, what)
#endif

static int iss_quantize(jlm_cu_rt *r, const float *x, const jlm_cu_act *a, int stream)
{
    if (bad_stream(r, stream))
        return EMU_FAULT;
    if (a->k % 32)
        return failf(r, EMU_FAULT, "quantize: %llu elements, not whole blocks of 32", (unsigned long long)a->k);
    if (!a->k)
        return 0;
    LAUNCH(jlm_cu_launch_quantize(x, a, r->s[stream]), "quantize");
    emu_kern k = {.kind = K_QUANT, .a = x, .act = *a, .rd = {{x, a->k * 4, "quantize: input"}}};
    pthread_mutex_lock(&r->mu);
    int rc = emu_dev(r, a->q, a->k, "quantize: codes") || emu_dev(r, a->d, a->k / 8, "quantize: scales") ||
                     emu_dev(r, a->sum16, a->k / 8, "quantize: sums")
                 ? EMU_FAULT
                 : emu_kernel_push(r, &k, 0, 0, stream);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

static int iss_rmsnorm(jlm_cu_rt *r, float *out, const float *x, const float *w, uint64_t n, uint32_t rows,
                       float eps, int stream)
{
    if (bad_stream(r, stream))
        return EMU_FAULT;
    if (!n || !rows)
        return 0;
    LAUNCH(jlm_cu_launch_rmsnorm_rows(out, x, w, n, rows, eps, r->s[stream]), "rmsnorm");
    emu_kern k = {.kind = K_RMS, .out = out, .a = x, .w = w, .n = n, .rows = rows, .s = eps,
                  .rd = {{x, n * rows * 4, "rmsnorm: input"}, {w, w ? n * 4 : 0, "rmsnorm: weight"}}};
    EMU_LOCKED(emu_kernel_push(r, &k, n * rows * 4, 0, stream));
}

static int iss_rope(jlm_cu_rt *r, const jlm_cu_rope *p, float *x, uint32_t n_head, uint32_t head_dim, int64_t pos,
                    int stream)
{
    if (bad_stream(r, stream))
        return EMU_FAULT;
    if (p->n_rot > head_dim || p->n_rot % 2)
        return failf(r, EMU_FAULT, "rope: %u rotated of a %u-wide head", p->n_rot, head_dim);
    LAUNCH(jlm_cu_launch_rope(p, x, n_head, head_dim, pos, r->s[stream]), "rope");
    emu_kern k = {.kind = K_ROPE, .out = x, .rope = *p, .n_head = n_head, .hd = head_dim, .pos = pos,
                  .rd = {{p->freq_factors, p->freq_factors ? p->n_rot / 2 * 4ull : 0, "rope: freq factors"},
                         {p->dpos, p->dpos ? 4 : 0, "rope: position"}}};
    EMU_LOCKED(emu_kernel_push(r, &k, (uint64_t)n_head * head_dim * 4, 0, stream));
}

static int iss_elem(jlm_cu_rt *r, int op, float *out, const float *a, const float *b, uint64_t n, float s, float lim,
                    int stream)
{
    if (bad_stream(r, stream))
        return EMU_FAULT;
    if (!n)
        return 0;
    LAUNCH(jlm_cu_launch_elem(op, out, a, b, n, s, lim, r->s[stream]), "elementwise");
    emu_kern k = {.kind = K_ELEM, .op = op, .out = out, .a = a, .b = b, .n = n, .s = s, .lim = lim,
                  .rd = {{a, n * 4, "elementwise: a"}, {b, b ? n * 4 : 0, "elementwise: b"}}};
    EMU_LOCKED(emu_kernel_push(r, &k, n * 4, 0, stream));
}

static int iss_to_f16(jlm_cu_rt *r, uint16_t *out, const float *x, uint64_t n, int stream)
{
    if (bad_stream(r, stream))
        return EMU_FAULT;
    if (!n)
        return 0;
    LAUNCH(jlm_cu_launch_to_f16(out, x, n, r->s[stream]), "f16 rows");
    emu_kern k = {.kind = K_F16, .out = (float *)(void *)out, .a = x, .n = n, .rd = {{x, n * 4, "f16 rows: input"}}};
    EMU_LOCKED(emu_kernel_push(r, &k, n * 2, 0, stream));
}

static int iss_kv_q8(jlm_cu_rt *r, void *out, const float *x, uint64_t n, int stream)
{
    if (bad_stream(r, stream))
        return EMU_FAULT;
    if (n % 32)
        return failf(r, EMU_FAULT, "q8_0 rows: %llu floats, not whole blocks of 32", (unsigned long long)n);
    if (!n)
        return 0;
    LAUNCH(jlm_cu_launch_kv_q8(out, x, n, r->s[stream]), "q8_0 rows");
    emu_kern k = {.kind = K_Q8, .out = out, .a = x, .n = n, .rd = {{x, n * 4, "q8_0 rows: input"}}};
    EMU_LOCKED(emu_kernel_push(r, &k, jlm_cu_kv_bytes(JLM_CU_KV_Q8_0, n), 0, stream));
}

static int iss_attn(jlm_cu_rt *r, const jlm_cu_attn *p, const float *q, const void *k, const void *v, float *scores,
                    float *out, int stream)
{
    if (bad_stream(r, stream))
        return EMU_FAULT;
    if (!p->n_head || !p->n_head_kv || p->n_head % p->n_head_kv || !p->n_kv)
        return failf(r, EMU_FAULT, "attention: %u heads over %u kv heads, %llu keys", p->n_head, p->n_head_kv,
                     (unsigned long long)p->n_kv);
    LAUNCH(jlm_cu_launch_attn(p, q, k, v, scores, out, r->s[stream]), "attention");
    uint64_t kn, vn;
    attn_bytes(p, &kn, &vn);
    emu_kern kr = {.kind = K_ATTN, .out = out, .scores = scores, .a = q, .b = k, .c = v, .attn = *p,
                   .rd = {{q, (uint64_t)p->n_head * p->head_dim * 4, "attention: q"}, {k, kn, "attention: keys"},
                          {v, vn, "attention: values"},
                          {p->sinks ? (const void *)p->sinks : (const void *)p->mask,
                           p->sinks ? p->n_head * 4ull : p->mask ? p->n_kv * 4 : 0, "attention: sinks or mask"},
                          {p->dpos, p->dpos ? 4 : 0, "attention: position"}}};
    EMU_LOCKED(emu_kernel_push(r, &kr, (uint64_t)p->n_head * p->head_dim_v * 4, (uint64_t)p->n_head * p->n_kv * 4,
                               stream));
}

static int iss_d2d_rows(jlm_cu_rt *r, void *dst, uint64_t dp, const void *src, uint64_t sp, uint64_t n,
                        uint64_t rows, int stream)
{
    if (bad_stream(r, stream))
        return EMU_FAULT;
    if (!n || !rows)
        return 0;
    if (dp < n || sp < n)
        return failf(r, EMU_FAULT, "device copy: rows of %llu bytes %llu and %llu apart", (unsigned long long)n,
                     (unsigned long long)dp, (unsigned long long)sp);
    DEVICE_CALL_COUNTED(cudaMemcpy2DAsync(dst, (size_t)dp, src, (size_t)sp, (size_t)n, (size_t)rows,
                                          cudaMemcpyDeviceToDevice, r->s[stream]),
                        "cudaMemcpy2DAsync (device to device)");
    pthread_mutex_lock(&r->mu);
    int rc = emu_dev(r, dst, (rows - 1) * dp + n, "device copy: destination") ||
                     emu_dev(r, src, (rows - 1) * sp + n, "device copy: source")
                 ? EMU_FAULT
                 : emu_push(r, stream, &(emu_op){.kind = OP_COPY, .dst = dst, .src = src, .n = n, .rows = rows,
                                                 .dp = dp, .sp = sp, .d2d = 1});
    pthread_mutex_unlock(&r->mu);
    return rc;
}

static int iss_rmsnorm_strided(jlm_cu_rt *r, float *out, const float *x, const float *w, uint64_t n, uint32_t rows,
                               uint32_t stride, float eps, int stream)
{
    if (bad_stream(r, stream))
        return EMU_FAULT;
    if (stride < n || rows > 65535)
        return failf(r, EMU_FAULT, "rmsnorm: %u rows of %llu floats %u apart", rows, (unsigned long long)n, stride);
    if (!n || !rows)
        return 0;
    LAUNCH(jlm_cu_launch_rmsnorm_strided(out, x, w, n, rows, stride, eps, r->s[stream]), "rmsnorm");
    uint64_t span = ((uint64_t)(rows - 1) * stride + n) * 4;
    emu_kern k = {.kind = K_RMS, .out = out, .a = x, .w = w, .n = n, .rows = rows, .s = eps, .stride = stride,
                  .rd = {{x, span, "rmsnorm: input"}, {w, w ? n * 4 : 0, "rmsnorm: weight"}}};
    EMU_LOCKED(emu_kernel_push(r, &k, span, 0, stream));
}

static int iss_rope_rows(jlm_cu_rt *r, const jlm_cu_rope *p, float *x, uint32_t n_head, uint32_t head_dim,
                         const jlm_cu_rows *rows, int stream)
{
    if (bad_stream(r, stream))
        return EMU_FAULT;
    if (p->n_rot > head_dim || p->n_rot % 2 || rows->n > 65535 || p->dpos)
        return failf(r, EMU_FAULT, "rope: %u rotated of a %u-wide head, %u rows%s", p->n_rot, head_dim, rows->n,
                     p->dpos ? ", a device position (the rows' are the table's)" : "");
    if (!rows->n || !p->n_rot || !n_head)
        return 0;
    LAUNCH(jlm_cu_launch_rope_rows(p, x, n_head, head_dim, rows, r->s[stream]), "rope");
    emu_kern k = {.kind = K_ROPE_ROWS, .out = x, .rope = *p, .n_head = n_head, .hd = head_dim, .rws = *rows,
                  .rd = {{p->freq_factors, p->freq_factors ? p->n_rot / 2 * 4ull : 0, "rope: freq factors"},
                         {rows->pos, rows->n * 4ull, "rope: positions"}}};
    EMU_LOCKED(emu_kernel_push(r, &k, ((rows->n - 1) * rows->x_stride + (uint64_t)n_head * head_dim) * 4, 0, stream));
}

static int iss_add_rows(jlm_cu_rt *r, float *out, const float *a, const float *b, uint64_t m, uint32_t rows,
                        int stream)
{
    if (bad_stream(r, stream))
        return EMU_FAULT;
    if (rows > 65535)
        return failf(r, EMU_FAULT, "rows add: %u rows", rows);
    if (!m || !rows)
        return 0;
    LAUNCH(jlm_cu_launch_add_rows(out, a, b, m, rows, r->s[stream]), "rows add");
    emu_kern k = {.kind = K_ADD_ROWS, .out = out, .a = a, .w = b, .n = m, .rows = rows,
                  .rd = {{a, m * rows * 4, "rows add: a"}, {b, m * 4, "rows add: b"}}};
    EMU_LOCKED(emu_kernel_push(r, &k, m * rows * 4, 0, stream));
}

static int iss_attn_rows(jlm_cu_rt *r, const jlm_cu_attn *p, const float *q, const void *k, const void *v,
                         uint64_t n_pos, float *scores, float *out, const jlm_cu_rows *rows, int stream)
{
    if (bad_stream(r, stream))
        return EMU_FAULT;
    if (!p->n_head || !p->n_head_kv || p->n_head % p->n_head_kv || !p->n_kv || p->mask || p->dpos || rows->n > 65535 ||
        rows->sc_stride < (uint64_t)p->n_head * p->n_kv || p->n_kv > n_pos ||
        rows->kb != jlm_cu_kv_bytes(p->k_type, p->k_stride) || rows->vb != jlm_cu_kv_bytes(p->v_type, p->v_stride))
        return failf(r, EMU_FAULT, "attention rows: %u heads over %u kv heads, %llu keys of %llu, %u rows",
                     p->n_head, p->n_head_kv, (unsigned long long)p->n_kv, (unsigned long long)n_pos, rows->n);
    if (!rows->n)
        return 0;
    LAUNCH(jlm_cu_launch_attn_rows(p, q, k, v, scores, out, rows, r->s[stream]), "attention");
    /* every position of the cache a span may name, from the start of the first KV head */
    jlm_cu_attn all = *p;
    uint64_t kn, vn;
    all.n_kv = n_pos;
    attn_bytes(&all, &kn, &vn);
    uint64_t y1 = rows->n - 1;
    emu_kern kr = {.kind = K_ATTN_ROWS, .out = out, .scores = scores, .a = q, .b = k, .c = v, .attn = *p,
                   .rws = *rows, .n_pos = n_pos,
                   .rd = {{q, (y1 * rows->x_stride + (uint64_t)p->n_head * p->head_dim) * 4, "attention: q"},
                          {k, kn, "attention: keys"}, {v, vn, "attention: values"},
                          {p->sinks, p->sinks ? p->n_head * 4ull : 0, "attention: sinks"},
                          {rows->span, rows->n * 8ull, "attention: spans"}}};
    EMU_LOCKED(emu_kernel_push(r, &kr, (y1 * rows->o_stride + (uint64_t)p->n_head * p->head_dim_v) * 4,
                               (y1 * rows->sc_stride + (uint64_t)p->n_head * p->n_kv) * 4, stream));
}

static int iss_moe_combine(jlm_cu_rt *r, float *x, const float *ys, const float *w, uint32_t n_used, uint64_t n,
                           int stream)
{
    if (bad_stream(r, stream))
        return EMU_FAULT;
    if (!n || !n_used)
        return 0;
    LAUNCH(jlm_cu_launch_moe_combine(x, ys, w, n_used, n, r->s[stream]), "expert combine");
    emu_kern k = {.kind = K_COMB, .out = x, .a = x, .b = ys, .w = w, .n = n, .rows = n_used,
                  .rd = {{x, n * 4, "expert combine: x"}, {ys, n_used * n * 4, "expert combine: outputs"},
                         {w, n_used * 4ull, "expert combine: weights"}}};
    EMU_LOCKED(emu_kernel_push(r, &k, n * 4, 0, stream));
}

static int iss_kv_store(jlm_cu_rt *r, int t, void *base, uint64_t row_bytes, uint64_t cap, const uint32_t *dpos,
                        const float *x, uint64_t n, int stream)
{
    if (t == JLM_CU_KV_Q8_0 && n % 32)
        return failf(r, EMU_FAULT, "cache store: %llu floats, not whole blocks of 32", (unsigned long long)n);
    if (!n)
        return 0;
    LAUNCH(jlm_cu_launch_kv_store(t, base, row_bytes, dpos, x, n, r->s[stream]), "cache store");
    emu_kern k = {.kind = K_STORE, .op = t, .out = base, .a = x, .n = n, .dpos = dpos, .row_bytes = row_bytes,
                  .cap = cap, .rd = {{x, n * 4, "cache store: input"}, {dpos, 4, "cache store: position"}}};
    EMU_LOCKED(emu_kernel_push(r, &k, cap, 0, stream));
}

/* ---------------------------------------------------------------- the tape: graphs of a token's launches */

/* While a token is taped (jlm_cu_rt_graph), the compute stream's copies
 * and launches are recorded, not issued; a segment ends where the host
 * waits (a sync, a free), or at a call that is not a graph's (an event, a
 * stamp, a copy from pageable memory), and is then issued: as the graph of
 * the segment at that ordinal of the token when it equals the segment taped
 * there last time (captured the second time it is seen, replayed after),
 * else op by op. So anything baked into a launch (a buffer, a split, the
 * cache, an expert) that changed is a different segment: never a stale
 * graph. The emulation's graph is the tape itself, replayed through the
 * same strict checks as a call. */
enum { T_H2D, T_D2H, T_D2D, T_MATVEC, T_QUANT, T_RMS, T_ROPE, T_ELEM, T_F16, T_Q8, T_STORE, T_ATTN, T_COMB,
       T_D2D_ROWS, T_RMS_STRIDED, T_ROPE_ROWS, T_ADD_ROWS, T_ATTN_ROWS };

typedef struct tape_op {
    int          kind, op;
    void        *dst;
    const void  *src, *p2, *p3;
    float       *f;
    uint64_t     n, n2, n3, n4;
    uint32_t     rows, nh, hd, pad_;
    int64_t      pos;
    float        s, lim;
    jlm_cu_mat   m;
    jlm_cu_batch b;
    jlm_cu_act   act;
    jlm_cu_rope  rope;
    jlm_cu_attn  attn;
    jlm_cu_rows  rws;   /* the row calls': the row table's pointers compared with the rest */
} tape_op;

static int issue(jlm_cu_rt *r, const tape_op *o, int s)
{
    r->cnt.calls++;
    switch (o->kind) {
    case T_H2D: return iss_h2d(r, o->dst, o->src, o->n, s);
    case T_D2H: return iss_d2h(r, o->dst, o->src, o->n, s);
    case T_D2D: return iss_d2d(r, o->dst, o->src, o->n, s);
    case T_MATVEC: return iss_matvec(r, &o->m, &o->b, o->n, o->src, o->p2, o->f, s);
    case T_QUANT: return iss_quantize(r, o->src, &o->act, s);
    case T_RMS: return iss_rmsnorm(r, o->f, o->src, o->p2, o->n, o->rows, o->s, s);
    case T_ROPE: return iss_rope(r, &o->rope, o->f, o->nh, o->hd, o->pos, s);
    case T_ELEM: return iss_elem(r, o->op, o->f, o->src, o->p2, o->n, o->s, o->lim, s);
    case T_F16: return iss_to_f16(r, o->dst, o->src, o->n, s);
    case T_Q8: return iss_kv_q8(r, o->dst, o->src, o->n, s);
    case T_STORE: return iss_kv_store(r, o->op, o->dst, o->n2, o->n3, o->p2, o->src, o->n, s);
    case T_ATTN: return iss_attn(r, &o->attn, o->src, o->p2, o->p3, o->f, o->dst, s);
    case T_D2D_ROWS: return iss_d2d_rows(r, o->dst, o->n2, o->src, o->n3, o->n, o->n4, s);
    case T_RMS_STRIDED: return iss_rmsnorm_strided(r, o->f, o->src, o->p2, o->n, o->rows, (uint32_t)o->n2, o->s, s);
    case T_ROPE_ROWS: return iss_rope_rows(r, &o->rope, o->f, o->nh, o->hd, &o->rws, s);
    case T_ADD_ROWS: return iss_add_rows(r, o->f, o->src, o->p2, o->n, o->rows, s);
    case T_ATTN_ROWS: return iss_attn_rows(r, &o->attn, o->src, o->p2, o->p3, o->n, o->f, o->dst, &o->rws, s);
    default: return iss_moe_combine(r, o->f, o->src, o->p2, o->rows, o->n, s);
    }
}

static int issue_all(jlm_cu_rt *r, const tape_op *v, size_t n)
{
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++)
        rc = issue(r, &v[i], JLM_CU_S_COMPUTE);
    return rc;
}

static void slot_drop(jlm_cu_graph *g)
{
#ifdef JLM_CUDA
    if (g->exec)
        cudaGraphExecDestroy(g->exec);
    g->exec = NULL;
#endif
    g->captured = 0;
}

/* Slot g's tape as a device graph (the emulation's is the tape). */
static int capture(jlm_cu_rt *r, jlm_cu_graph *g)
{
    r->cnt.captures++;
    g->captured = 1;
#ifdef JLM_CUDA
    if (!r->emulated) {
        cudaStream_t s = r->s[JLM_CU_S_COMPUTE];
        cudaGraph_t gr = NULL;
        r->cnt.calls += 3;
        if (cu(r, cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture")) {
            g->captured = 0;
            return EMU_FAULT;
        }
        r->capturing = 1;   /* the launches captured count when the graph is launched (replay) */
        r->cap_launches = 0;
        int rc = issue_all(r, g->t.v, g->t.n);
        r->capturing = 0;
        g->launches = r->cap_launches;
        cudaError_t e = cudaStreamEndCapture(s, &gr);
        if (!rc)
            rc = cu(r, e, "cudaStreamEndCapture");
        if (!rc)
            rc = cu(r, cudaGraphInstantiate(&g->exec, gr, 0), "cudaGraphInstantiate");
        if (gr)
            cudaGraphDestroy(gr);
        if (rc)
            slot_drop(g);
        return rc;
    }
#endif
    return 0;
}

static int replay(jlm_cu_rt *r, jlm_cu_graph *g)
{
    r->cnt.graph_launches++;
    r->cnt.graph_ops += g->t.n;
    r->cnt.calls++;   /* the graph launch: one call */
#ifdef JLM_CUDA
    if (!r->emulated) {
        int rc = cu(r, cudaGraphLaunch(g->exec, r->s[JLM_CU_S_COMPUTE]), "cudaGraphLaunch");
        if (!rc)   /* its launches and device copies, as the emulation's replay counts them */
            __atomic_add_fetch(&r->launches, g->launches, __ATOMIC_RELAXED);
        return rc;
    }
#endif
    /* the emulation replays the ops through the calls' own checks (not host calls: not counted; their
     * launches and device copies are, in jlm_cu_rt_launches, as they are enqueued) */
    uint64_t calls = r->cnt.calls;
    int rc = issue_all(r, g->t.v, g->t.n);
    r->cnt.calls = calls;
    return rc;
}

/* The taped segment issued (r->tmu held): its slot's graph when the slot
 * holds the same tape (captured the first time it repeats), else op by op,
 * the slot then remembering it. */
static int seg_end(jlm_cu_rt *r)
{
    if (!r->cur.n)
        return 0;
    jlm_cu_graph *g = r->ord < JLM_CU_NGRAPH ? &r->g[r->ord] : NULL;
    r->ord++;
    if (g && g->t.n == r->cur.n && !memcmp(g->t.v, r->cur.v, r->cur.n * sizeof *r->cur.v)) {
        r->cur.n = 0;
        int rc = g->captured ? 0 : capture(r, g);
        return rc ? rc : replay(r, g);
    }
    int rc = issue_all(r, r->cur.v, r->cur.n);
    if (g) {
        jlm_cu_tape t = g->t;
        slot_drop(g);
        g->t = r->cur;
        r->cur = t;
    }
    r->cur.n = 0;
    return rc;
}

static int pinned_span(const jlm_cu_rt *r, const void *p, uint64_t n)
{
    for (size_t i = 0; i < r->npin; i++)
        if ((const uint8_t *)p >= r->pin[i].p && n <= r->pin[i].n &&
            (uint64_t)((const uint8_t *)p - r->pin[i].p) <= r->pin[i].n - n)
            return 1;
    return 0;
}

/* An op from a call: taped while a token is and it can be a graph's, else
 * issued after the taped segment of its stream. */
static int submit(jlm_cu_rt *r, const tape_op *o, int stream)
{
    if (bad_stream(r, stream))
        return EMU_FAULT;
    pthread_mutex_lock(&r->tmu);
    int rc = 0;
    int tape = r->taping && stream == JLM_CU_S_COMPUTE &&
               (o->kind == T_H2D ? pinned_span(r, o->src, o->n) : o->kind == T_D2H ? pinned_span(r, o->dst, o->n) : 1);
    if (tape) {
        if (r->cur.n == r->cur.cap) {
            size_t c = r->cur.cap ? r->cur.cap * 2 : 64;
            tape_op *v = realloc(r->cur.v, c * sizeof *v);
            if (!v)
                rc = failf(r, EMU_FAULT, "cuda: out of memory for the graph's tape");
            else {
                r->cur.v = v;
                r->cur.cap = c;
            }
        }
        if (!rc)
            r->cur.v[r->cur.n++] = *o;
    } else {
        if (stream == JLM_CU_S_COMPUTE)
            rc = seg_end(r);
        if (!rc)
            rc = issue(r, o, stream);
    }
    pthread_mutex_unlock(&r->tmu);
    return rc;
}

/* Before a call that is no graph's on stream (JLM_CU_NSTREAM: any): the
 * compute stream's taped segment issued. */
static int seg_before(jlm_cu_rt *r, int stream)
{
    pthread_mutex_lock(&r->tmu);
    int rc = stream == JLM_CU_S_COMPUTE || stream == JLM_CU_NSTREAM ? seg_end(r) : 0;
    r->cnt.calls++;
    pthread_mutex_unlock(&r->tmu);
    return rc;
}

int jlm_cu_rt_graph(jlm_cu_rt *r, int on)
{
    pthread_mutex_lock(&r->tmu);
    int rc = 0;
    if (on && !r->taping && r->graph_ok) {
        r->taping = 1;
        r->ord = 0;
    } else if (!on) {
        rc = seg_end(r);
        r->taping = 0;
    }
    pthread_mutex_unlock(&r->tmu);
    return rc;
}

void jlm_cu_rt_counts(jlm_cu_rt *r, jlm_cu_rt_count *out)
{
    pthread_mutex_lock(&r->tmu);
    *out = r->cnt;
    pthread_mutex_unlock(&r->tmu);
}

static void tape_free(jlm_cu_rt *r)
{
    for (int i = 0; i < JLM_CU_NGRAPH; i++) {
        slot_drop(&r->g[i]);
        free(r->g[i].t.v);
    }
    free(r->cur.v);
    free(r->pin);
}

static void top(tape_op *o, int kind)
{
    memset(o, 0, sizeof *o);
    o->kind = kind;
}

/* Structs with padding into a zeroed op field by field: the padding stays
 * zero, so equal launches compare equal (segments are compared byte for
 * byte: a row table's pointers and strides are part of the op). */
static void tape_rope(tape_op *o, const jlm_cu_rope *p)
{
    o->rope.n_rot = p->n_rot, o->rope.neox = p->neox, o->rope.orig_ctx = p->orig_ctx, o->rope.freq_base = p->freq_base;
    o->rope.freq_scale = p->freq_scale, o->rope.ext_factor = p->ext_factor, o->rope.attn_factor = p->attn_factor;
    o->rope.beta_fast = p->beta_fast, o->rope.beta_slow = p->beta_slow, o->rope.freq_factors = p->freq_factors;
    o->rope.dpos = p->dpos;
}

static void tape_rows(tape_op *o, const jlm_cu_rows *rw)
{
    o->rws.n = rw->n, o->rws.x_stride = rw->x_stride, o->rws.o_stride = rw->o_stride;
    o->rws.sc_stride = rw->sc_stride, o->rws.kb = rw->kb, o->rws.vb = rw->vb, o->rws.pos = rw->pos;
    o->rws.span = rw->span;
}

/* ---------------------------------------------------------------- the calls */

/* An op of a destination, a source and a count (the copies, the F16 and
 * Q8_0 rows). */
static int submit_copy(jlm_cu_rt *r, int kind, void *dst, const void *src, uint64_t n, int stream)
{
    tape_op o;
    top(&o, kind);
    o.dst = dst, o.src = src, o.n = n;
    return submit(r, &o, stream);
}

/* An op of an output, two inputs and rows rows of n (the bias rows, the
 * expert combine). */
static int submit_rows(jlm_cu_rt *r, int kind, float *f, const void *src, const void *p2, uint32_t rows, uint64_t n,
                       int stream)
{
    tape_op o;
    top(&o, kind);
    o.f = f, o.src = src, o.p2 = p2, o.rows = rows, o.n = n;
    return submit(r, &o, stream);
}

int jlm_cu_rt_h2d(jlm_cu_rt *r, void *dev, const void *host, uint64_t n, int stream)
{
    return submit_copy(r, T_H2D, dev, host, n, stream);
}

int jlm_cu_rt_d2h(jlm_cu_rt *r, void *host, const void *dev, uint64_t n, int stream)
{
    return submit_copy(r, T_D2H, host, dev, n, stream);
}

int jlm_cu_rt_d2d(jlm_cu_rt *r, void *dst, const void *src, uint64_t n, int stream)
{
    return submit_copy(r, T_D2D, dst, src, n, stream);
}

int jlm_cu_rt_matvec_batch(jlm_cu_rt *r, const jlm_cu_mat *m, const jlm_cu_batch *b, uint64_t n, const float *x,
                           const jlm_cu_act *xq, float *y, int stream)
{
    tape_op o;
    top(&o, T_MATVEC);
    o.m = *m, o.b = *b, o.n = n, o.src = x, o.p2 = xq, o.f = y;
    return submit(r, &o, stream);
}

int jlm_cu_rt_quantize(jlm_cu_rt *r, const float *x, const jlm_cu_act *a, int stream)
{
    tape_op o;
    top(&o, T_QUANT);
    o.src = x, o.act = *a;
    return submit(r, &o, stream);
}

int jlm_cu_rt_rmsnorm(jlm_cu_rt *r, float *out, const float *x, const float *w, uint64_t n, uint32_t rows, float eps,
                      int stream)
{
    tape_op o;
    top(&o, T_RMS);
    o.f = out, o.src = x, o.p2 = w, o.n = n, o.rows = rows, o.s = eps;
    return submit(r, &o, stream);
}

int jlm_cu_rt_rope(jlm_cu_rt *r, const jlm_cu_rope *p, float *x, uint32_t n_head, uint32_t head_dim, int64_t pos,
                   int stream)
{
    tape_op o;
    top(&o, T_ROPE);
    tape_rope(&o, p);
    o.f = x, o.nh = n_head, o.hd = head_dim, o.pos = p->dpos ? 0 : pos;
    return submit(r, &o, stream);
}

int jlm_cu_rt_elem(jlm_cu_rt *r, int op, float *out, const float *a, const float *b, uint64_t n, float s, float lim,
                   int stream)
{
    tape_op o;
    top(&o, T_ELEM);
    o.op = op, o.f = out, o.src = a, o.p2 = b, o.n = n, o.s = s, o.lim = lim;
    return submit(r, &o, stream);
}

int jlm_cu_rt_to_f16(jlm_cu_rt *r, uint16_t *out, const float *x, uint64_t n, int stream)
{
    return submit_copy(r, T_F16, out, x, n, stream);
}

int jlm_cu_rt_kv_q8(jlm_cu_rt *r, void *out, const float *x, uint64_t n, int stream)
{
    return submit_copy(r, T_Q8, out, x, n, stream);
}

int jlm_cu_rt_kv_store(jlm_cu_rt *r, int type, void *base, uint64_t row_bytes, uint64_t cap, const uint32_t *dpos,
                       const float *x, uint64_t n, int stream)
{
    tape_op o;
    top(&o, T_STORE);
    o.op = type, o.dst = base, o.n2 = row_bytes, o.n3 = cap, o.p2 = dpos, o.src = x, o.n = n;
    return submit(r, &o, stream);
}

int jlm_cu_rt_attn(jlm_cu_rt *r, const jlm_cu_attn *p, const float *q, const void *k, const void *v, float *scores,
                   float *out, int stream)
{
    tape_op o;
    top(&o, T_ATTN);
    o.attn = *p, o.src = q, o.p2 = k, o.p3 = v, o.f = scores, o.dst = out;
    return submit(r, &o, stream);
}

int jlm_cu_rt_d2d_rows(jlm_cu_rt *r, void *dst, uint64_t dp, const void *src, uint64_t sp, uint64_t n, uint64_t rows,
                       int stream)
{
    tape_op o;
    top(&o, T_D2D_ROWS);
    o.dst = dst, o.n2 = dp, o.src = src, o.n3 = sp, o.n = n, o.n4 = rows;
    return submit(r, &o, stream);
}

int jlm_cu_rt_rmsnorm_strided(jlm_cu_rt *r, float *out, const float *x, const float *w, uint64_t n, uint32_t rows,
                              uint32_t stride, float eps, int stream)
{
    tape_op o;
    top(&o, T_RMS_STRIDED);
    o.f = out, o.src = x, o.p2 = w, o.n = n, o.rows = rows, o.n2 = stride, o.s = eps;
    return submit(r, &o, stream);
}

int jlm_cu_rt_rope_rows(jlm_cu_rt *r, const jlm_cu_rope *p, float *x, uint32_t n_head, uint32_t head_dim,
                        const jlm_cu_rows *rows, int stream)
{
    tape_op o;
    top(&o, T_ROPE_ROWS);
    tape_rope(&o, p);
    tape_rows(&o, rows);
    o.f = x, o.nh = n_head, o.hd = head_dim;
    return submit(r, &o, stream);
}

int jlm_cu_rt_add_rows(jlm_cu_rt *r, float *out, const float *a, const float *b, uint64_t m, uint32_t rows,
                       int stream)
{
    return submit_rows(r, T_ADD_ROWS, out, a, b, rows, m, stream);
}

int jlm_cu_rt_attn_rows(jlm_cu_rt *r, const jlm_cu_attn *p, const float *q, const void *k, const void *v,
                        uint64_t n_pos, float *scores, float *out, const jlm_cu_rows *rows, int stream)
{
    tape_op o;
    top(&o, T_ATTN_ROWS);
    tape_rows(&o, rows);
    o.attn = *p, o.src = q, o.p2 = k, o.p3 = v, o.n = n_pos, o.f = scores, o.dst = out;
    return submit(r, &o, stream);
}

int jlm_cu_rt_moe_combine(jlm_cu_rt *r, float *x, const float *ys, const float *w, uint32_t n_used, uint64_t n,
                          int stream)
{
    return submit_rows(r, T_COMB, x, ys, w, n_used, n, stream);
}

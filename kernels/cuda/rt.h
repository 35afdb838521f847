/* rt.h - the CUDA backend's device seam: device memory, pinned host memory,
 * two streams, events, the matvec launch and the kernels of a whole block
 * (engine/exec_cu.c), either on a CUDA device (the
 * CUDA runtime, when built with it) or emulated on the host.
 *
 * Why an emulation: the machines this is built and tested on have no GPU, and
 * the engine's CUDA backend (engine/backend_cu.c) is mostly plumbing: which
 * frame holds which plane, what is copied when, which stream waits for which.
 * The emulated device runs the same per-thread kernel bodies as the device
 * (kernels/cuda/body.h over the jlm_cu_k_matvec grid) and is strict where a device
 * would be forgiving or racy, so plumbing bugs fail the suite:
 *  - every device pointer handed to a copy or a launch must lie inside a live
 *    device allocation with room for the whole span (the matrix planes, the
 *    activations, the act records and what they point to, the result), and a
 *    host pointer must not be device memory;
 *  - operations are queued per stream and run only when something waits for
 *    them (a stream or event synchronize, a stream waiting on an event, a
 *    free): a copy from pinned memory reads the source when it runs, a copy
 *    to the host lands when it runs, and a kernel on one stream sees another
 *    stream's copy only through an event. Reusing a pinned staging buffer
 *    before its copy ran, reading a result before synchronizing, or
 *    launching before waiting for a page-in gives wrong bytes;
 *  - device memory starts as a poison pattern (0xA5), not zeros.
 * A copy from pageable host memory consumes its source at the call (as the
 * CUDA runtime stages it); its landing is still queued.
 *
 * Streams: JLM_CU_S_COMPUTE (0) and JLM_CU_S_COPY (1). Events: JLM_CU_NEV
 * small integers; a wait captures the event's latest record at call time.
 *
 * Failure: every call returns 0 or an error code; jlm_cu_rt_error names the
 * last one (device: the cudaError_t's string; emulated: what was wrong).
 * Thread safety: the emulated device locks its state in every call (the
 * backend's copy thread and the graph's thread share it); the device calls
 * are the CUDA runtime's, which is thread-safe. jlm_cu_rt_error is the
 * calling thread's last error. */
#ifndef JLM_CU_RT_H
#define JLM_CU_RT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/body.h"

typedef struct jlm_cu_rt jlm_cu_rt;

enum { JLM_CU_S_COMPUTE = 0, JLM_CU_S_COPY = 1, JLM_CU_NSTREAM = 2 };
#define JLM_CU_NEV 8

/* emulate: 1 runs on the host emulation (always available), 0 opens CUDA
 * device `device` (fails with the probe's reason without one). */
int  jlm_cu_rt_open(int device, int emulate, jlm_cu_rt **out, char *why, size_t why_len);
void jlm_cu_rt_close(jlm_cu_rt *r);   /* frees whatever is still allocated; accepts NULL */
int  jlm_cu_rt_emulated(const jlm_cu_rt *r);
const char *jlm_cu_rt_name(const jlm_cu_rt *r);
uint64_t jlm_cu_rt_free_bytes(const jlm_cu_rt *r);   /* device memory free now; emulated: 0 (unknown) */

int  jlm_cu_rt_alloc(jlm_cu_rt *r, uint64_t n, void **dev);
void jlm_cu_rt_free(jlm_cu_rt *r, void *dev);        /* waits for both streams first; NULL ok */
int  jlm_cu_rt_host_alloc(jlm_cu_rt *r, uint64_t n, void **host);   /* pinned */
void jlm_cu_rt_host_free(jlm_cu_rt *r, void *host);  /* waits for both streams first; NULL ok */

int jlm_cu_rt_h2d(jlm_cu_rt *r, void *dev, const void *host, uint64_t n, int stream);
int jlm_cu_rt_d2h(jlm_cu_rt *r, void *host, const void *dev, uint64_t n, int stream);
int jlm_cu_rt_record(jlm_cu_rt *r, int ev, int stream);
int jlm_cu_rt_wait(jlm_cu_rt *r, int stream, int ev);   /* stream waits for ev's latest record */
int jlm_cu_rt_event_sync(jlm_cu_rt *r, int ev);         /* the host waits for ev's latest record */
int jlm_cu_rt_sync(jlm_cu_rt *r, int stream);

/* Timing (jlm bench --profile): stamp i (< JLM_CU_NSTAMP) recorded on a
 * stream marks when that stream's work before it is done (device: a timing
 * event, made at its first use; emulated: the host's clock when the queued
 * stamp runs, so an emulated interval is the host's run of the ops in it).
 * jlm_cu_rt_stamp_ns: the ns from stamp i to stamp j, both recorded, after
 * the host waited for their stream; EMU_FAULT-like error when one has not
 * run. */
#define JLM_CU_NSTAMP 512
int jlm_cu_rt_stamp(jlm_cu_rt *r, uint32_t i, int stream);
int jlm_cu_rt_stamp_ns(jlm_cu_rt *r, uint32_t i, uint32_t j, uint64_t *ns);

/* The jlm_cu_k_matvec grid: m's planes, x (n, k) floats or xq (n act records, each
 * pointing at device memory), y (n, rows): all device pointers. */
int jlm_cu_rt_matvec(jlm_cu_rt *r, const jlm_cu_mat *m, uint64_t n, const float *x, const jlm_cu_act *xq, float *y,
                     int stream);
/* b->n sheets in one grid (kernels/cuda/body.h's jlm_cu_batch: m is sheet 0;
 * x floats at t*tx + h*bx, or xq's record h*rs + t (rs >= n); y rows at
 * t*ty + h*by): each (sheet, token) row as jlm_cu_rt_matvec computes it
 * alone. n and b->n <= 65535, plane strides multiples of 4. */
int jlm_cu_rt_matvec_batch(jlm_cu_rt *r, const jlm_cu_mat *m, const jlm_cu_batch *b, uint64_t n, const float *x,
                           const jlm_cu_act *xq, float *y, int stream);

/* A whole block's kernels (engine/exec_cu.c), queued on stream as the
 * matvec; every pointer is device memory, structs are the host's (passed by
 * value to the launch). d2d: a device-to-device copy. quantize: a->k floats
 * of x (whole blocks of 32) into a's codes, scales and sums. rmsnorm: rows
 * rows of n floats, each times w (NULL: none). rope: n_head heads of x at
 * position pos. elem: enum jlm_cu_op over n elements (b NULL for the unary
 * ones). to_f16: n floats of x into n halves at out, nearest even (an F16
 * cache's rows, as jlm_kv_put_row). kv_q8: n floats (whole blocks of 32)
 * into n / 32 Q8_0 blocks at out, any byte (a Q8_0 cache's rows, as
 * jlm_kv_put_row). attn: decode attention of one token (body.h's
 * jlm_cu_attn; k and v of p->k_type and p->v_type). */
int jlm_cu_rt_d2d(jlm_cu_rt *r, void *dst, const void *src, uint64_t n, int stream);
int jlm_cu_rt_quantize(jlm_cu_rt *r, const float *x, const jlm_cu_act *a, int stream);
int jlm_cu_rt_rmsnorm(jlm_cu_rt *r, float *out, const float *x, const float *w, uint64_t n, uint32_t rows, float eps,
                      int stream);
int jlm_cu_rt_rope(jlm_cu_rt *r, const jlm_cu_rope *p, float *x, uint32_t n_head, uint32_t head_dim, int64_t pos,
                   int stream);
int jlm_cu_rt_elem(jlm_cu_rt *r, int op, float *out, const float *a, const float *b, uint64_t n, float s, float lim,
                   int stream);
int jlm_cu_rt_to_f16(jlm_cu_rt *r, uint16_t *out, const float *x, uint64_t n, int stream);
int jlm_cu_rt_kv_q8(jlm_cu_rt *r, void *out, const float *x, uint64_t n, int stream);
/* A decoded token's n floats of x into the cache row at the position in
 * device memory dpos: base + *dpos * row_bytes (cap bytes of cache from
 * base), of type type (JLM_CU_KV_*), as jlm_cu_rt_d2d / to_f16 / kv_q8
 * write it (bit-identical): the launch is the same every token. */
int jlm_cu_rt_kv_store(jlm_cu_rt *r, int type, void *base, uint64_t row_bytes, uint64_t cap, const uint32_t *dpos,
                       const float *x, uint64_t n, int stream);
int jlm_cu_rt_attn(jlm_cu_rt *r, const jlm_cu_attn *p, const float *q, const void *k, const void *v, float *scores,
                   float *out, int stream);
/* A prefill's rows in one launch each (body.h's jlm_cu_rows; r->pos and
 * r->span device memory, read when the kernel runs): rope_rows rotates row
 * y's n_head heads at x + y*x_stride at position pos[y]; add_rows adds b (m
 * floats) to each of rows rows of m floats; attn_rows is jlm_cu_rt_attn of
 * each row over its span of keys, p->n_kv the most keys a row has (r's
 * sc_stride >= n_head * p->n_kv), k and v position 0 of a cache of n_pos
 * positions (a span past it fails; emulated: when the kernel runs). The
 * rows' positions are the table's: a rope or attention dpos is refused.
 * Taped like any call (jlm_cu_rt_graph), the table's pointers part of the
 * op a segment is compared by. */
/* rows rows of n bytes from src (sp bytes apart) to dst (dp apart): one
 * strided device copy (cudaMemcpy2DAsync). rmsnorm_strided: rmsnorm of rows
 * rows of n floats, stride floats apart (in place or not). */
int jlm_cu_rt_d2d_rows(jlm_cu_rt *r, void *dst, uint64_t dp, const void *src, uint64_t sp, uint64_t n, uint64_t rows,
                       int stream);
int jlm_cu_rt_rmsnorm_strided(jlm_cu_rt *r, float *out, const float *x, const float *w, uint64_t n, uint32_t rows,
                              uint32_t stride, float eps, int stream);
int jlm_cu_rt_rope_rows(jlm_cu_rt *r, const jlm_cu_rope *p, float *x, uint32_t n_head, uint32_t head_dim,
                        const jlm_cu_rows *rows, int stream);
int jlm_cu_rt_add_rows(jlm_cu_rt *r, float *out, const float *a, const float *b, uint64_t m, uint32_t rows,
                       int stream);
int jlm_cu_rt_attn_rows(jlm_cu_rt *r, const jlm_cu_attn *p, const float *q, const void *k, const void *v,
                        uint64_t n_pos, float *scores, float *out, const jlm_cu_rows *rows, int stream);
/* x (n floats) += the mixture of n_used expert outputs ys ((n_used, n)
 * contiguous) weighted by w (n_used): jlm_cu_k_moe_combine, bit-identical to
 * jlm_k_moe_combine. */
int jlm_cu_rt_moe_combine(jlm_cu_rt *r, float *x, const float *ys, const float *w, uint32_t n_used, uint64_t n,
                          int stream);

/* Kernel launches and device-to-device copies enqueued so far (the
 * matvec's included; host <-> device copies not): jlm_dev_stats.dispatches.
 * A graph's ops count each time the graph is launched (not when it is
 * captured), so the count is the same with graphs on or off. */
uint64_t jlm_cu_rt_launches(const jlm_cu_rt *r);

/* Graphs. jlm_cu_rt_graph(r, 1) at a decoded token's first launch tapes
 * the compute stream's copies (from and to pinned memory, device to
 * device) and launches instead of issuing them; the taped segment is
 * issued where the host waits (a sync, a free), before any other call on
 * the compute stream (an event, a stamp, a copy from pageable memory), and
 * at jlm_cu_rt_graph(r, 0), which ends the token. The k-th segment of a
 * token that equals the k-th of the token before it (every op and argument
 * the same) is captured as a graph (device: stream capture, instantiated
 * once) and replayed (one cudaGraphLaunch) while it keeps repeating; any
 * difference (a buffer moved, another split, expert or cache) issues the
 * segment op by op and is remembered for the next token. The emulation's
 * graph is the tape, replayed through the calls' own checks when the graph
 * launch runs. JLM_CUDA_GRAPH=0 (read at open) leaves every op issued.
 * Positions the ops read from device memory (dpos) keep a token's launches
 * equal. Counts: host calls into the device runtime (launches and copies
 * issued one by one, waits, records, syncs, graph launches, captures' three),
 * graph launches, captures, and the ops the graph launches ran. */
typedef struct jlm_cu_rt_count {
    uint64_t calls, graph_launches, captures, graph_ops;
} jlm_cu_rt_count;
int  jlm_cu_rt_graph(jlm_cu_rt *r, int on);
void jlm_cu_rt_counts(jlm_cu_rt *r, jlm_cu_rt_count *out);

const char *jlm_cu_rt_error(const jlm_cu_rt *r);

#endif

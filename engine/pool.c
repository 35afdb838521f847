/* pool.c - parallel-for thread pool with spin-then-sleep workers (see pool.h).
 *
 * Protocol. `gen` is a sequence lock over the job (pool_job's fields): the
 * dispatcher makes it odd, writes the job and the counters of the dispatch
 * (`claim`, `units_done`, `pending`), then makes it even (seq_cst). A worker
 * that saw generation g waits for gen != g: first spinning, then, under `mu`,
 * incrementing `n_sleep`, re-checking gen and sleeping on `wake`. The
 * dispatcher reads `n_sleep` after its store (seq_cst): either the worker's
 * re-check sees the new generation or the dispatcher sees the sleeper and
 * broadcasts under `mu`, so no wake-up is lost. A worker copies the job and
 * keeps the copy only if gen was even and unchanged around it (the fields
 * are written with release and read with acquire: a copy that saw any field
 * of a newer job sees the odd generation after it, and is thrown away).
 *
 * Completion. A dispatch with one slice per thread (and a profiled one) waits
 * for every worker: `pending` counts them down. A claimed dispatch waits only
 * for its pieces (`units_done` reaching the job's units): a worker that has
 * not started by the time the others took every piece (asleep, or its CPU
 * given to another process) is not waited for. It may start later: it claims
 * from `claim`, whose high half is the job's tag (gen / 2), by compare and
 * swap, so it can take a piece only of the job it copied, and only while that
 * job still has pieces (the dispatch has not returned). Both waits end in a
 * sleep on `done` with the same handshake (`caller_sleeps`).
 */
#include "engine/pool.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define POOL_MAX_THREADS 256
#define POOL_DEFAULT_SPIN 4000u   /* wait steps before sleeping */
#define POOL_PAUSE_SPINS  256u    /* of which pause-only when oversubscribed */

struct jlm_pool {
    int        n_threads;             /* including the caller */
    unsigned   spin;                  /* busy-wait iterations before sleeping */
    unsigned   yield_after;           /* wait steps that pause before the rest yield */
    pthread_t *threads;               /* (n_threads - 1,) */

    /* the current job (pool_job's fields; read under the sequence lock gen) */
    _Atomic(jlm_pool_fn) j_fn;
    _Atomic(void *)       j_ctx;
    _Atomic size_t        j_n, j_grain, j_units, j_chunk;
    _Atomic unsigned      j_flags;

    /* changes during routine operation */
    _Atomic unsigned long gen;        /* job generation: odd while the job is written */
    _Atomic unsigned long long claim; /* claimed dispatch: tag << 32 | the next unclaimed grain */
    _Atomic size_t        units_done; /* claimed dispatch: grains run */
    /* what the workers report of their measured claimed pieces since the
     * caller last took it (split_check): CPU ns in them, and of that the ns
     * on the CPU the caller ran on when it published the job (caller_cpu) */
    _Atomic unsigned long long rep_cpu, rep_same;
    _Atomic int           caller_cpu;
    _Atomic int           pending;    /* workers still running the current job (slices, profiled) */
    _Atomic int           n_sleep;    /* workers asleep on `wake` */
    _Atomic int           caller_sleeps;
    pthread_mutex_t       mu;
    pthread_cond_t        wake;       /* workers wait here for a new gen */
    pthread_cond_t        done;       /* the caller waits here for the dispatch's end */

    /* claimed dispatches (pool.h, "A stalled worker"): the mode, and the
     * time until which they run on the caller alone */
    int                mode;          /* POOL_ADAPTIVE, POOL_CLAIM or POOL_STATIC */
    unsigned long long solo_until;    /* ns, CLOCK_MONOTONIC; 0: none */
    unsigned long long solo_ns;       /* the last solo period's length */
    unsigned long long free_at;       /* the next look for free CPUs in a busy period, ns */
    int                solo_busy;     /* this solo period began with no CPU free for the workers */
    int                loadavg_fd;    /* /proc/loadavg (its running count), or -1 */
    int                n_cpus;        /* the CPUs this process may run on */
    unsigned long long stalls;        /* solo periods started */
    unsigned long long solo_from;     /* ns: the start of the solo period in force */
    unsigned long long solo_done;     /* ns in solo periods that are over */
    int                probing;       /* a solo period ended and the workers are on trial */
    /* recent split claimed dispatches (decayed, ns): wall time, the workers'
     * CPU time in pieces and the part on the caller's CPU, the caller's
     * waits for them, its time off its CPU in its own pieces */
    double ev_wall, ev_gain, ev_same, ev_wait, ev_lost;

    /* profiling (pool.h): a profiled dispatch carries JOB_PROF */
    int             prof;
    unsigned long long t_begin;       /* this dispatch's start, ns */
    unsigned long long *t_slice;      /* (n_threads, 2) each thread's slice start, end */
    jlm_pool_stats  st;
};

typedef struct pool_arg { jlm_pool *p; int idx; } pool_arg;

/* A job as a worker copied it. chunk 0: one slice per thread (slice_of);
 * else pieces of chunk grains claimed from p->claim. tag: gen / 2. */
enum { JOB_MEASURE = 1, JOB_PROF = 2, JOB_STOP = 4 };
typedef struct pool_job {
    jlm_pool_fn fn;
    void       *ctx;
    size_t      n, grain, units, chunk;
    unsigned    flags, tag;
} pool_job;
#define POOL_TAG(tag) ((unsigned long long)(tag) << 32)
#define POOL_CLAIM_MAX 0x7fffffffu        /* grains of a claimed dispatch (the claim word's low half) */

/* One wait step of iteration i: a pause, or past yield_after a sched_yield.
 * The pool yields only when it has more threads than the CPUs it may run on
 * (pool_yield_after): then the thread waited for may be queued behind the
 * waiter, and yielding lets it run (3 threads on 2 cores: pure spinning cost
 * ~1.4 ms a dispatch). Otherwise every thread has a CPU of its own and a
 * yield only hands the core to whatever else is runnable, at any nice level,
 * for its time slice, while the other threads wait at the next barrier
 * (docs/pager.md, Thread pool: 2-thread decode ran 3x slower beside two
 * nice-19 processes). */
static inline void cpu_relax(const jlm_pool *p, unsigned i)
{
    if (i >= p->yield_after) {
        sched_yield();
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Pieces per thread of a claimed dispatch (jlm_pool_for_claim). */
#define POOL_CLAIMS 4

/* A stalled worker (pool.h). Each claimed dispatch weighs what its workers
 * brought against what they cost the caller. Gain: the CPU time the workers
 * spent in their pieces (reported by each worker after its last piece, taken
 * by the caller at its next check). Harm: the caller's wait for pieces still
 * held when its own were done (a worker that lost its core in the middle of
 * one), plus the caller's own time off its CPU in its pieces, in the share of
 * the workers' CPU time that ran on the caller's CPU (two threads sharing one
 * core, as a neighbour on the other leaves them; the rest is some other
 * process's doing, which no split changes). A worker that has not started
 * costs nothing: the caller takes every piece and does not wait for it. Both
 * are summed over the recent claimed dispatches with an exponential decay in
 * wall time (POOL_WINDOW_NS), so a one-off stall of a few milliseconds in a
 * long prefill is outweighed by the work around it. Once the sums hold
 * POOL_EVIDENCE_NS of wall time and the harm exceeds the gain (by more than
 * POOL_SLACK of the wall time), a solo period starts: SOLO_FACTOR times the
 * last dispatch's wait for its workers, or twice the last period while on
 * trial (the first split dispatches after a period, until they hold the
 * evidence and pay), within [SOLO_MIN_NS, SOLO_MAX_NS]. A period that began
 * with no CPU free for the workers (cpus_free: the running count against the
 * CPUs) looks again every POOL_FREE_LOOK_NS and ends as soon as there is
 * one, with short periods again: the load that began it has left (a
 * neighbour's end, or the model's first reads). */
#define POOL_WINDOW_NS   8000000.0
#define POOL_SLACK       0.05            /* harm within 5% of the wall time: none */
#define POOL_EVIDENCE_NS 3000000.0
#define POOL_FREE_LOOK_NS 2000000ull    /* a busy solo period looks for free CPUs this often */
#define POOL_SOLO_FACTOR 8ull
#define POOL_SOLO_MIN_NS 4000000ull
#define POOL_SOLO_MAX_NS 100000000ull
enum { POOL_ADAPTIVE = 0, POOL_CLAIM = 1, POOL_STATIC = 2 };

/* Slice [*b, *e) of thread t of n_threads: contiguous, grain-aligned boundaries. */
static void slice_of(const pool_job *j, int n_threads, int t, size_t *b, size_t *e)
{
    size_t grain = j->grain, units = j->units;
    size_t per = units / (size_t)n_threads, rem = units % (size_t)n_threads;
    size_t ub = (size_t)t * per + ((size_t)t < rem ? (size_t)t : rem);
    size_t ue = ub + per + ((size_t)t < rem ? 1 : 0);
    *b = ub * grain < j->n ? ub * grain : j->n;
    *e = ue * grain < j->n ? ue * grain : j->n;
}

static unsigned long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

/* The wall clock and the calling thread's CPU time (ns). A thread's wall
 * time in its pieces beyond its CPU time is time off its CPU: preempted
 * (the pieces do not block: their pages are pinned before they run). */
typedef struct run_mark { unsigned long long wall, cpu; } run_mark;
static void run_mark_now(run_mark *r)
{
    struct timespec ts;
    r->wall = now_ns();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    r->cpu = (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

/* Wakes the caller if it sleeps on `done` (after the last piece or worker). */
static void wake_caller(jlm_pool *p)
{
    if (atomic_load(&p->caller_sleeps)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Claims and runs pieces of job j until none is left (or the dispatch is
 * over: another tag); 1 if it ran any. Each piece's grains count into
 * units_done; a worker whose piece completes the job wakes the caller. */
static int claim_pieces(jlm_pool *p, const pool_job *j, int t)
{
    int ran = 0;
    unsigned long long v = atomic_load_explicit(&p->claim, memory_order_relaxed);
    for (;;) {
        if ((v & ~0xffffffffull) != POOL_TAG(j->tag) || (v & 0xffffffffull) >= j->units)
            return ran;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &v, v + j->chunk, memory_order_relaxed,
                                                   memory_order_relaxed))
            continue;
        size_t u = (size_t)(v & 0xffffffffull), ue = u + j->chunk < j->units ? u + j->chunk : j->units;
        size_t e = ue * j->grain;
        j->fn(j->ctx, u * j->grain, e < j->n ? e : j->n, t);
        ran = 1;
        if (atomic_fetch_add(&p->units_done, ue - u) + (ue - u) == j->units && t > 0)
            wake_caller(p);
        v = atomic_load_explicit(&p->claim, memory_order_relaxed);
    }
}

/* Thread t's part of job j: its slice, or pieces claimed. */
static void run_job(jlm_pool *p, const pool_job *j, int t)
{
    unsigned long long *ts = j->flags & JOB_PROF ? p->t_slice + 2 * t : NULL;
    if (ts)
        ts[0] = now_ns();
    if (j->chunk == 0) {
        size_t b, e;
        slice_of(j, p->n_threads, t, &b, &e);
        if (b < e)
            j->fn(j->ctx, b, e, t);
    } else {
        int measure = t > 0 && (j->flags & JOB_MEASURE);
        run_mark r0 = {0, 0}, r1;
        if (measure)
            run_mark_now(&r0);
        if (claim_pieces(p, j, t) && measure) {   /* report (split_check) */
            run_mark_now(&r1);
            unsigned long long cpu = r1.cpu > r0.cpu ? r1.cpu - r0.cpu : 0;
            atomic_fetch_add_explicit(&p->rep_cpu, cpu, memory_order_relaxed);
            if (sched_getcpu() == atomic_load_explicit(&p->caller_cpu, memory_order_relaxed))
                atomic_fetch_add_explicit(&p->rep_same, cpu, memory_order_relaxed);
        }
    }
    if (ts)
        ts[1] = now_ns();
}

/* Does thread 0 wait for every worker (pending), or only for the pieces? */
static int job_waits_all(const pool_job *j)
{
    return j->chunk == 0 || (j->flags & JOB_PROF);
}

/* After a profiled dispatch (every slice done): fold its times in. */
static void prof_fold(jlm_pool *p)
{
    unsigned long long end = now_ns();
    p->st.dispatches++;
    p->st.wall_ns += end - p->t_begin;
    for (int t = 0; t < p->n_threads; t++) {
        const unsigned long long *ts = p->t_slice + 2 * t;
        unsigned long long s0 = ts[0] > p->t_begin ? ts[0] : p->t_begin, s1 = ts[1] > s0 ? ts[1] : s0;
        p->st.busy_ns += s1 - s0;
        p->st.wait_ns += (s0 - p->t_begin) + (end > s1 ? end - s1 : 0);
    }
}

void jlm_pool_profile(jlm_pool *p, int on)
{
    if (p)
        p->prof = on && p->t_slice;
}

void jlm_pool_stats_get(const jlm_pool *p, jlm_pool_stats *out)
{
    if (p)
        *out = p->st;
    else
        memset(out, 0, sizeof *out);
}

void jlm_pool_stats_reset(jlm_pool *p)
{
    if (p)
        memset(&p->st, 0, sizeof p->st);
}

static void worker_finish(jlm_pool *p)
{
    if (atomic_fetch_sub(&p->pending, 1) == 1)
        wake_caller(p);
}

/* One wait step of a spin-wait (step *i): 0 once it should sleep instead. */
static int spin_step(const jlm_pool *p, unsigned *i)
{
    if (*i >= p->spin)
        return 0;
    cpu_relax(p, *i);
    (*i)++;
    return 1;
}

/* Waits for a generation other than seen and copies its job into *j (the
 * sequence lock: gen even and the same before and after the copy); returns
 * the generation. */
static unsigned long job_wait(jlm_pool *p, unsigned long seen, pool_job *j)
{
    for (;;) {
        unsigned long g;
        unsigned i = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen && spin_step(p, &i))
            ;
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleep, 1);
            while ((g = atomic_load(&p->gen)) == seen)
                pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->n_sleep, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (g & 1) {                       /* being written */
            cpu_relax(p, 0);
            continue;
        }
        j->fn = atomic_load_explicit(&p->j_fn, memory_order_acquire);
        j->ctx = atomic_load_explicit(&p->j_ctx, memory_order_acquire);
        j->n = atomic_load_explicit(&p->j_n, memory_order_acquire);
        j->grain = atomic_load_explicit(&p->j_grain, memory_order_acquire);
        j->units = atomic_load_explicit(&p->j_units, memory_order_acquire);
        j->chunk = atomic_load_explicit(&p->j_chunk, memory_order_acquire);
        j->flags = atomic_load_explicit(&p->j_flags, memory_order_acquire);
        if (atomic_load_explicit(&p->gen, memory_order_relaxed) != g)
            continue;
        j->tag = (unsigned)(g >> 1);
        return g;
    }
}

static void *worker_main(void *v)
{
    pool_arg *a = v;
    jlm_pool *p = a->p;
    int idx = a->idx;
    free(a);
    unsigned long seen = 0;
    for (;;) {
        pool_job j;
        seen = job_wait(p, seen, &j);
        if (j.flags & JOB_STOP)
            return NULL;
        run_job(p, &j, idx);
        if (job_waits_all(&j))
            worker_finish(p);
    }
}

/* Publishes job j (its tag set here) under the sequence lock with the
 * dispatch's counters, and wakes sleepers if any (see the protocol above). */
static void publish(jlm_pool *p, pool_job *j)
{
    unsigned long g = atomic_load_explicit(&p->gen, memory_order_relaxed);   /* only we write it */
    atomic_store_explicit(&p->gen, g + 1, memory_order_relaxed);
    atomic_store_explicit(&p->j_fn, j->fn, memory_order_release);
    atomic_store_explicit(&p->j_ctx, j->ctx, memory_order_release);
    atomic_store_explicit(&p->j_n, j->n, memory_order_release);
    atomic_store_explicit(&p->j_grain, j->grain, memory_order_release);
    atomic_store_explicit(&p->j_units, j->units, memory_order_release);
    atomic_store_explicit(&p->j_chunk, j->chunk, memory_order_release);
    atomic_store_explicit(&p->j_flags, j->flags, memory_order_release);
    j->tag = (unsigned)((g + 2) >> 1);
    atomic_store_explicit(&p->claim, POOL_TAG(j->tag), memory_order_relaxed);
    atomic_store_explicit(&p->units_done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, job_waits_all(j) ? p->n_threads - 1 : 0, memory_order_relaxed);
    atomic_store(&p->gen, g + 2);
    if (atomic_load(&p->n_sleep) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Is there a CPU for each worker beside the caller? The running count of
 * /proc/loadavg (the tasks on a CPU or waiting for one, the caller included)
 * against the CPUs this process may use. 1 when unknown. */
static int cpus_free(const jlm_pool *p)
{
    char b[128];
    int running = 0;
    if (p->loadavg_fd < 0)
        return 1;
    ssize_t n = pread(p->loadavg_fd, b, sizeof b - 1, 0);
    if (n <= 0)
        return 1;
    b[n] = 0;
    if (sscanf(b, "%*s %*s %*s %d", &running) != 1)
        return 1;
    return p->n_cpus - running >= p->n_threads - 1;
}

/* After a split claimed dispatch from m0 (its start) to now, the caller
 * done with its own pieces at m_self: fold in its costs and the workers'
 * reports, and start a solo period when the harm has lately exceeded the
 * gain (see POOL_WINDOW_NS). */
static void split_check(jlm_pool *p, const run_mark *m0, const run_mark *m_self)
{
    unsigned long long end = now_ns();
    double wall = (double)(end - m0->wall), mine = (double)(m_self->wall - m0->wall);
    double cpu = (double)(m_self->cpu - m0->cpu), lost = mine > cpu ? mine - cpu : 0;
    double keep = wall < POOL_WINDOW_NS ? 1.0 - wall / POOL_WINDOW_NS : 0;
    p->ev_wall = p->ev_wall * keep + wall;
    p->ev_gain = p->ev_gain * keep + (double)atomic_exchange_explicit(&p->rep_cpu, 0, memory_order_relaxed);
    p->ev_same = p->ev_same * keep + (double)atomic_exchange_explicit(&p->rep_same, 0, memory_order_relaxed);
    p->ev_wait = p->ev_wait * keep + (double)(end - m_self->wall);
    p->ev_lost = p->ev_lost * keep + lost;
    if (p->ev_wall < POOL_EVIDENCE_NS)
        return;
    /* the caller's waits, and its time off its CPU in the share the workers
     * ran beside it on that CPU (the rest: some other process's doing) */
    double beside = p->ev_gain > 0 ? p->ev_same / p->ev_gain : 0;
    double harm = p->ev_wait + p->ev_lost * (beside < 1 ? beside : 1);
    if (harm <= p->ev_gain + POOL_SLACK * p->ev_wall) {
        p->probing = 0;                        /* the workers pay: stay split */
        return;
    }
    unsigned long long solo = (end - m_self->wall) * POOL_SOLO_FACTOR;
    if (p->probing && solo < 2 * p->solo_ns)
        solo = 2 * p->solo_ns;
    solo = solo < POOL_SOLO_MIN_NS ? POOL_SOLO_MIN_NS : solo > POOL_SOLO_MAX_NS ? POOL_SOLO_MAX_NS : solo;
    p->solo_ns = solo;
    p->solo_until = end + solo;
    p->solo_from = end;
    p->solo_busy = !cpus_free(p);
    p->free_at = end + POOL_FREE_LOOK_NS;
    p->stalls++;
}

/* Is job j still running: a worker (pending), or a piece (units_done)? */
static int job_left(jlm_pool *p, const pool_job *j)
{
    return job_waits_all(j) ? atomic_load(&p->pending) > 0 : atomic_load(&p->units_done) < j->units;
}

/* Thread 0's wait for the end of job j: every worker, or every piece. */
static void caller_wait(jlm_pool *p, const pool_job *j)
{
    unsigned i = 0;
    while (job_left(p, j) && spin_step(p, &i))
        ;
    if (job_left(p, j)) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_sleeps, 1);
        while (job_left(p, j))
            pthread_cond_wait(&p->done, &p->mu);
        atomic_store(&p->caller_sleeps, 0);
        pthread_mutex_unlock(&p->mu);
    }
}

static void pool_run(jlm_pool *p, size_t n, size_t grain, int claim, jlm_pool_fn fn, void *ctx)
{
    if (n == 0)
        return;
    if (p && claim && p->mode != POOL_ADAPTIVE)
        claim = p->mode == POOL_CLAIM;
    int adapt = p && claim && p->mode == POOL_ADAPTIVE && !p->prof;   /* profiled: split as asked */
    unsigned long long t0 = adapt || (p && p->solo_until && !p->prof) ? now_ns() : 0;
    if (p && p->solo_until && t0 < p->solo_until && p->solo_busy && t0 >= p->free_at) {
        p->free_at = t0 + POOL_FREE_LOOK_NS;   /* a busy period: does the load that began it remain? */
        if (cpus_free(p)) {
            p->solo_until = t0;
            p->solo_ns = 0;                /* it left: a trial now, and short periods again */
        }
    }
    if (p && p->solo_until && t0 >= p->solo_until) {
        p->solo_done += p->solo_until - p->solo_from;
        p->solo_until = 0;                 /* the period is over: the workers on trial */
        p->probing = 1;
        p->ev_wall = p->ev_gain = p->ev_same = p->ev_wait = p->ev_lost = 0;
        atomic_store_explicit(&p->rep_cpu, 0, memory_order_relaxed);   /* reports from before the period */
        atomic_store_explicit(&p->rep_same, 0, memory_order_relaxed);
    }
    if (!p || p->n_threads == 1 || n <= (grain ? grain : 1) || (t0 && t0 < p->solo_until)) {
        fn(ctx, 0, n, 0);
        return;
    }
    pool_job j = {.fn = fn, .ctx = ctx, .n = n, .grain = grain ? grain : 1};
    j.units = (n + j.grain - 1) / j.grain;
    if (claim && j.units <= POOL_CLAIM_MAX) {
        j.chunk = j.units / ((size_t)p->n_threads * POOL_CLAIMS);
        if (j.chunk == 0)
            j.chunk = 1;
    }
    j.flags = (adapt ? JOB_MEASURE : 0) | (p->prof ? JOB_PROF : 0);
    if (p->prof)
        p->t_begin = now_ns();
    run_mark m0 = {0, 0}, m_self = {0, 0};
    if (adapt) {
        run_mark_now(&m0);
        atomic_store_explicit(&p->caller_cpu, sched_getcpu(), memory_order_relaxed);
    }
    publish(p, &j);
    run_job(p, &j, 0);
    if (adapt)
        run_mark_now(&m_self);
    caller_wait(p, &j);
    if (p->prof)
        prof_fold(p);
    if (adapt)
        split_check(p, &m0, &m_self);
}

void jlm_pool_for(jlm_pool *p, size_t n, size_t grain, jlm_pool_fn fn, void *ctx)
{
    pool_run(p, n, grain, 0, fn, ctx);
}

void jlm_pool_for_claim(jlm_pool *p, size_t n, size_t grain, jlm_pool_fn fn, void *ctx)
{
    pool_run(p, n, grain, 1, fn, ctx);
}

unsigned long long jlm_pool_stalls(const jlm_pool *p)
{
    return p ? p->stalls : 0;
}

unsigned long long jlm_pool_solo_ns(const jlm_pool *p)
{
    if (!p || !p->solo_until)
        return p ? p->solo_done : 0;
    unsigned long long now = now_ns(), end = now < p->solo_until ? now : p->solo_until;   /* the period in force */
    return p->solo_done + end - p->solo_from;
}

/* $JLM_POOL: "static" (claimed dispatches split as jlm_pool_for's), "claim"
 * (claimed, never solo), else adaptive (the default). */
static int pool_mode(void)
{
    const char *m = getenv("JLM_POOL");
    return m && !strcmp(m, "static") ? POOL_STATIC : m && !strcmp(m, "claim") ? POOL_CLAIM : POOL_ADAPTIVE;
}

static void pool_stop(jlm_pool *p, int n_started)
{
    pool_job j = {.flags = JOB_STOP};
    publish(p, &j);
    /* a worker may sleep between our n_sleep check and its wait: the
     * protocol rules that out, but a broadcast here is cheap insurance */
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < n_started; i++)
        pthread_join(p->threads[i], NULL);
}

/* The CPUs this process may run on (its affinity mask; the online count if
 * unreadable). */
static int pool_cpus(void)
{
    cpu_set_t set;
    long cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
    return cpus > 0 ? (int)cpus : 1;
}

/* POOL_PAUSE_SPINS when n_threads exceed the CPUs this process may run on,
 * else never. */
static unsigned pool_yield_after(int n_threads)
{
    return n_threads > pool_cpus() ? POOL_PAUSE_SPINS : UINT_MAX;
}

int jlm_pool_create(int n_threads, unsigned spin, jlm_pool **out, jlm_err *err)
{
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    if (n_threads > POOL_MAX_THREADS)
        n_threads = POOL_MAX_THREADS;
    jlm_pool *p = calloc(1, sizeof *p);
    if (!p)
        return jlm_errf(err, JLM_ENOMEM, "thread pool: out of memory");
    p->n_threads = n_threads;
    p->loadavg_fd = -1;
    p->spin = spin ? spin : POOL_DEFAULT_SPIN;
    p->yield_after = pool_yield_after(n_threads);
    p->mode = pool_mode();
    p->loadavg_fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    p->n_cpus = pool_cpus();
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    p->t_slice = calloc((size_t)n_threads * 2, sizeof *p->t_slice);
    if (!p->threads || !p->t_slice) {
        jlm_pool_destroy(p);
        return jlm_errf(err, JLM_ENOMEM, "thread pool: out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
        pool_arg *a = malloc(sizeof *a);
        int rc = ENOMEM;
        if (a) {
            a->p = p;
            a->idx = i;
            rc = pthread_create(&p->threads[i - 1], NULL, worker_main, a);
        }
        if (rc) {
            free(a);
            pool_stop(p, i - 1);
            p->n_threads = 1;
            jlm_pool_destroy(p);
            return jlm_errf(err, JLM_EIO, "thread pool: starting thread %d of %d: %s",
                            i, n_threads, strerror(rc));
        }
    }
    *out = p;
    return 0;
}

void jlm_pool_destroy(jlm_pool *p)
{
    if (!p)
        return;
    if (p->n_threads > 1 && p->threads)
        pool_stop(p, p->n_threads - 1);
    if (p->loadavg_fd >= 0)
        close(p->loadavg_fd);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p->t_slice);
    free(p);
}

int jlm_pool_n_threads(const jlm_pool *p)
{
    return p ? p->n_threads : 1;
}

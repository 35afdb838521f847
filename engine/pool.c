/* pool.c - parallel-for thread pool with spin-then-sleep workers (see pool.h).
 *
 * Protocol. The dispatcher writes the job (fn, ctx, n, grain), sets `pending`
 * to the number of workers, then increments `gen` (seq_cst). A worker that saw
 * generation g waits for gen != g: first spinning, then, under `mu`,
 * incrementing `n_sleep`, re-checking gen and sleeping on `wake`. The
 * dispatcher reads `n_sleep` after its increment (seq_cst): either the worker's
 * re-check sees the new generation or the dispatcher sees the sleeper and
 * broadcasts under `mu`, so no wake-up is lost. Completion mirrors this with
 * `pending`, `caller_sleeps` and `done`.
 */
#include "engine/pool.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
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

    /* the current job: written by the dispatcher before gen is bumped */
    jlm_pool_fn fn;
    void       *ctx;
    size_t      n, grain;
    size_t      units, chunk;         /* grains in [0, n); grains a claim takes */
    int         stop;                 /* set (then gen bumped) by destroy */

    /* changes during routine operation */
    _Atomic unsigned long gen;        /* job generation */
    _Atomic size_t        next;       /* the next unclaimed grain of the job */
    _Atomic int           pending;    /* workers still running the current job */
    _Atomic int           n_sleep;    /* workers asleep on `wake` */
    _Atomic int           caller_sleeps;
    pthread_mutex_t       mu;
    pthread_cond_t        wake;       /* workers wait here for a new gen */
    pthread_cond_t        done;       /* the caller waits here for pending == 0 */

    /* claimed dispatches (pool.h, "A stalled worker"): the mode, and the
     * time until which they run on the caller alone */
    int                mode;          /* POOL_ADAPTIVE, POOL_CLAIM or POOL_STATIC */
    unsigned long long solo_until;    /* ns, CLOCK_MONOTONIC; 0: none */
    unsigned long long solo_ns;       /* the last solo period's length */
    unsigned long long stalls;        /* solo periods started */
    int                probing;       /* a solo period ended and the workers are on trial */
    int                measure;       /* this dispatch's slices read their CPU time */
    unsigned long long *cpu_ns;       /* (n_threads,) each thread's CPU time in this dispatch */
    double par_wall, par_cpu;         /* recent split dispatches (decayed): wall time, CPU time */
    unsigned par_n;                   /* split dispatches in those sums (to POOL_EVIDENCE_N) */
    double one_wall, one_cpu;         /* recent claimed dispatches run solo: the same */

    /* profiling (pool.h): prof is read by workers at each job */
    int             prof;
    unsigned long long t_begin;       /* this dispatch's start, ns */
    unsigned long long *t_slice;      /* (n_threads, 2) each thread's slice start, end */
    jlm_pool_stats  st;
};

typedef struct pool_arg { jlm_pool *p; int idx; } pool_arg;

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

/* A stalled worker (pool.h). Each claimed dispatch measures the CPU time
 * its threads spent in their slices against its wall time, summed over recent
 * dispatches with a decay of POOL_DECAY a dispatch: the CPUs' worth of work
 * the split dispatches got done (par_cpu / par_wall), and the same for the
 * dispatches the caller ran alone (one_cpu / one_wall; a whole CPU until one
 * is measured). A worker that loses its core (a neighbour) adds wall time and
 * no work. A dispatch that had to wake a sleeping worker is left out: its
 * wake-up says nothing of a neighbour (on a VM an idle vCPU can take
 * milliseconds to run again), and counting it made solo periods feed
 * themselves (the workers sleep through a period, so the trial after it
 * woke them slowly and failed). Once the split dispatches
 * hold POOL_EVIDENCE_NS of wall time (or POOL_EVIDENCE_N dispatches) and got
 * less than POOL_TIE of what the caller alone gets done (a tie stays split:
 * the workers are there the moment a neighbour leaves), a solo period starts:
 * SOLO_FACTOR times the last dispatch's wait for its workers, or twice the
 * last period while on trial (the first split dispatches after a period,
 * until they hold the evidence and win), within [SOLO_MIN_NS, SOLO_MAX_NS].
 * A one-off stall of a few milliseconds in a long prefill is outweighed by
 * the work around it. */
#define POOL_DECAY       0.875          /* about the last 8 dispatches */
#define POOL_EVIDENCE_NS 2000000.0      /* or POOL_EVIDENCE_N dispatches */
#define POOL_EVIDENCE_N  8u
#define POOL_TIE         0.9            /* within 10% of the caller alone: a tie, kept split */
#define POOL_SOLO_FACTOR 8ull
#define POOL_SOLO_MIN_NS 4000000ull
#define POOL_SOLO_MAX_NS 100000000ull
enum { POOL_ADAPTIVE = 0, POOL_CLAIM = 1, POOL_STATIC = 2 };

/* Slice [*b, *e) of thread t: contiguous, grain-aligned boundaries. */
static void slice_of(const jlm_pool *p, int t, size_t *b, size_t *e)
{
    size_t grain = p->grain, units = p->units;
    size_t per = units / (size_t)p->n_threads, rem = units % (size_t)p->n_threads;
    size_t ub = (size_t)t * per + ((size_t)t < rem ? (size_t)t : rem);
    size_t ue = ub + per + ((size_t)t < rem ? 1 : 0);
    *b = ub * grain < p->n ? ub * grain : p->n;
    *e = ue * grain < p->n ? ue * grain : p->n;
}

static unsigned long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

static unsigned long long thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

static void run_slice(jlm_pool *p, int t)
{
    unsigned long long *ts = p->prof ? p->t_slice + 2 * t : NULL;
    unsigned long long c0 = p->measure ? thread_cpu_ns() : 0;
    if (ts)
        ts[0] = now_ns();
    if (p->chunk == 0) {                     /* one slice per thread */
        size_t b, e;
        slice_of(p, t, &b, &e);
        if (b < e)
            p->fn(p->ctx, b, e, t);
    } else {
        size_t u;
        while ((u = atomic_fetch_add_explicit(&p->next, p->chunk, memory_order_relaxed)) < p->units) {
            size_t b = u * p->grain, e = (u + p->chunk) * p->grain;
            p->fn(p->ctx, b, e < p->n ? e : p->n, t);
        }
    }
    if (ts)
        ts[1] = now_ns();
    if (p->measure)
        p->cpu_ns[t] = thread_cpu_ns() - c0;
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
    if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_sleeps)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
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
        unsigned long g;
        unsigned i = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen && i < p->spin) {
            cpu_relax(p, i);
            i++;
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->n_sleep, 1);
            while ((g = atomic_load(&p->gen)) == seen)
                pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->n_sleep, 1);
            pthread_mutex_unlock(&p->mu);
        }
        seen = g;
        if (p->stop)
            return NULL;
        run_slice(p, idx);
        worker_finish(p);
    }
}

/* Bumps the generation and wakes sleepers if any (see the protocol above);
 * 1 if some worker slept. */
static int publish(jlm_pool *p)
{
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->n_sleep) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
        return 1;
    }
    return 0;
}

/* After a split claimed dispatch that began at t0 and whose caller finished
 * its own pieces at t_self: fold it in, and start a solo period when the
 * split dispatches have lately got less done than the caller alone (see
 * POOL_DECAY). */
static void split_check(jlm_pool *p, unsigned long long t0, unsigned long long t_self, int woke)
{
    if (woke)
        return;   /* a worker woken from sleep: its wake-up is no evidence (after a solo period,
                   * or a pause between dispatches, a VM's idle vCPU can take milliseconds) */
    unsigned long long end = now_ns(), cpu = 0;
    for (int t = 0; t < p->n_threads; t++)
        cpu += p->cpu_ns[t];
    p->par_wall = p->par_wall * POOL_DECAY + (double)(end - t0);
    p->par_cpu = p->par_cpu * POOL_DECAY + (double)cpu;
    if (p->par_n < POOL_EVIDENCE_N)
        p->par_n++;
    if (p->par_wall < POOL_EVIDENCE_NS && p->par_n < POOL_EVIDENCE_N)
        return;
    double one = p->one_wall > 0 ? p->one_cpu / p->one_wall : 1.0;
    if (p->par_cpu >= POOL_TIE * one * p->par_wall) {
        p->probing = 0;                        /* the workers pay: stay split */
        return;
    }
    unsigned long long solo = (end - t_self) * POOL_SOLO_FACTOR;
    if (p->probing && solo < 2 * p->solo_ns)
        solo = 2 * p->solo_ns;
    solo = solo < POOL_SOLO_MIN_NS ? POOL_SOLO_MIN_NS : solo > POOL_SOLO_MAX_NS ? POOL_SOLO_MAX_NS : solo;
    p->solo_ns = solo;
    p->solo_until = end + solo;
    p->stalls++;
}

/* A claimed dispatch in a solo period: the caller alone, measured. */
static void solo_run(jlm_pool *p, size_t n, jlm_pool_fn fn, void *ctx)
{
    unsigned long long w0 = now_ns(), c0 = thread_cpu_ns();
    fn(ctx, 0, n, 0);
    unsigned long long c1 = thread_cpu_ns(), w1 = now_ns();
    p->one_wall = p->one_wall * POOL_DECAY + (double)(w1 - w0);
    p->one_cpu = p->one_cpu * POOL_DECAY + (double)(c1 - c0);
}

static void pool_run(jlm_pool *p, size_t n, size_t grain, int claim, jlm_pool_fn fn, void *ctx)
{
    if (n == 0)
        return;
    if (p && claim && p->mode != POOL_ADAPTIVE)
        claim = p->mode == POOL_CLAIM;
    int adapt = p && claim && p->mode == POOL_ADAPTIVE && !p->prof;   /* profiled: split as asked */
    unsigned long long t0 = adapt || (p && p->solo_until && !p->prof) ? now_ns() : 0;
    if (p && p->solo_until && t0 >= p->solo_until) {
        p->solo_until = 0;                 /* the period is over: the workers on trial */
        p->probing = 1;
        p->par_wall = p->par_cpu = 0;
        p->par_n = 0;
    }
    if (!p || p->n_threads == 1 || n <= (grain ? grain : 1) || (t0 && t0 < p->solo_until)) {
        if (adapt && t0 && t0 < p->solo_until)
            solo_run(p, n, fn, ctx);
        else
            fn(ctx, 0, n, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->grain = grain ? grain : 1;
    p->units = (n + p->grain - 1) / p->grain;
    p->chunk = 0;
    if (claim) {
        p->chunk = p->units / ((size_t)p->n_threads * POOL_CLAIMS);
        if (p->chunk == 0)
            p->chunk = 1;
    }
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);   /* published by the gen bump */
    p->measure = adapt;
    if (adapt)
        memset(p->cpu_ns, 0, (size_t)p->n_threads * sizeof *p->cpu_ns);
    if (p->prof)
        p->t_begin = now_ns();
    atomic_store(&p->pending, p->n_threads - 1);
    int woke = publish(p);
    run_slice(p, 0);
    unsigned long long t_self = adapt ? now_ns() : 0;
    unsigned i = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0 && i < p->spin) {
        cpu_relax(p, i);
        i++;
    }
    if (atomic_load(&p->pending) > 0) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_sleeps, 1);
        while (atomic_load(&p->pending) > 0)
            pthread_cond_wait(&p->done, &p->mu);
        atomic_store(&p->caller_sleeps, 0);
        pthread_mutex_unlock(&p->mu);
    }
    if (p->prof)
        prof_fold(p);
    if (adapt)
        split_check(p, t0, t_self, woke);
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

/* $JLM_POOL: "static" (claimed dispatches split as jlm_pool_for's), "claim"
 * (claimed, never solo), else adaptive (the default). */
static int pool_mode(void)
{
    const char *m = getenv("JLM_POOL");
    return m && !strcmp(m, "static") ? POOL_STATIC : m && !strcmp(m, "claim") ? POOL_CLAIM : POOL_ADAPTIVE;
}

static void pool_stop(jlm_pool *p, int n_started)
{
    p->stop = 1;
    publish(p);
    /* a worker may sleep between our n_sleep check and its wait: the
     * protocol rules that out, but a broadcast here is cheap insurance */
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < n_started; i++)
        pthread_join(p->threads[i], NULL);
}

/* POOL_PAUSE_SPINS when n_threads exceed the CPUs this process may run on
 * (its affinity mask; the online count if unreadable), else never. */
static unsigned pool_yield_after(int n_threads)
{
    cpu_set_t set;
    long cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : sysconf(_SC_NPROCESSORS_ONLN);
    return cpus > 0 && n_threads > cpus ? POOL_PAUSE_SPINS : UINT_MAX;
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
    p->spin = spin ? spin : POOL_DEFAULT_SPIN;
    p->yield_after = pool_yield_after(n_threads);
    p->mode = pool_mode();
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    p->t_slice = calloc((size_t)n_threads * 2, sizeof *p->t_slice);
    p->cpu_ns = calloc((size_t)n_threads, sizeof *p->cpu_ns);
    if (!p->threads || !p->t_slice || !p->cpu_ns) {
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
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p->t_slice);
    free(p->cpu_ns);
    free(p);
}

int jlm_pool_n_threads(const jlm_pool *p)
{
    return p ? p->n_threads : 1;
}

/* pool.h - a small thread pool for parallel-for over index ranges.
 *
 * Owns: n_threads - 1 worker threads; the calling thread is worker 0. One
 * dispatch splits [0, n) into n_threads contiguous slices (slice boundaries
 * multiples of `grain`, the last slice takes the remainder) and runs
 * fn(ctx, begin, end, thread_idx) on each; empty slices are skipped.
 *
 * Cost: jlm_pool_for is called hundreds of times per token (one matvec each),
 * so a dispatch is a generation-counter bump that spinning workers see within
 * a few hundred nanoseconds. Workers spin for `spin` iterations after each job,
 * then sleep on a condition variable; the dispatcher wakes sleepers only when
 * some are asleep (so an idle pool costs no CPU, a busy one no syscalls).
 *
 * Invariants:
 *  (1) Every index of [0, n) is passed to fn exactly once per dispatch.
 *  (2) jlm_pool_for returns only after every slice has returned; writes made
 *      by fn are visible to the caller (release/acquire on the done counter).
 *
 * Thread safety: one dispatching thread at a time per pool (not reentrant: fn
 * must not call jlm_pool_for on the same pool). fn runs concurrently on
 * different slices.
 */
#ifndef JLM_POOL_H
#define JLM_POOL_H

#include <stddef.h>

#include "base/jlm_err.h"

typedef struct jlm_pool jlm_pool;
typedef void (*jlm_pool_fn)(void *ctx, size_t begin, size_t end, int thread_idx);

/* Starts n_threads - 1 workers (n_threads <= 0: the number of online CPUs;
 * capped at 256). spin = busy-wait iterations before sleeping (0: default
 * 4000 pauses; when oversubscribed, 256 pauses, then sched_yield steps). JLM_ENOMEM / JLM_EIO (pthread_create, errno in the
 * message); *out untouched then and no thread left running. */
int  jlm_pool_create(int n_threads, unsigned spin, jlm_pool **out, jlm_err *err);
/* Stops and joins the workers; accepts NULL. */
void jlm_pool_destroy(jlm_pool *p);
/* Threads including the caller. Cannot fail. */
int  jlm_pool_n_threads(const jlm_pool *p);
/* Runs fn over [0, n) as described above. grain 0 is taken as 1. p may be
 * NULL: then fn(ctx, 0, n, 0) runs on the caller. Cannot fail. */
void jlm_pool_for(jlm_pool *p, size_t n, size_t grain, jlm_pool_fn fn, void *ctx);
/* The same over pieces of whole grains (about 4 per thread) that the threads
 * claim from a shared counter: a thread may run several pieces or none, so a
 * thread that starts late or loses its core for a while (a VM's other
 * tenants, a neighbour process) leaves its share to the others instead of
 * holding all at the barrier, and the call returns once every piece has run,
 * without waiting for a worker that took none (one still asleep, or waiting
 * for a CPU: it can take no piece of a dispatch that has returned). For compute-bound work (the prefill GEMM):
 * a memory-bound matvec streams its rows best as one slice per thread
 * (decode ran 0.7-0.9x with pieces; docs/pager.md, Thread pool). fn must not
 * depend on which thread runs a piece (thread_idx is for scratch). */
void jlm_pool_for_claim(jlm_pool *p, size_t n, size_t grain, jlm_pool_fn fn, void *ctx);
/* A stalled worker. A thread that loses its core in the middle of a piece
 * (a neighbour process on its CPU: the kernel gives each a few-millisecond
 * slice in turn) holds the dispatch until it runs again, while the caller
 * waits with nothing left to take; and when a neighbour on one core leaves
 * the two threads sharing the other, the worker's CPU time is the caller's
 * loss: beside a busy loop on one core a 2-thread prefill ran at 0.6-0.9 of
 * the 1-thread figure. So each claimed dispatch weighs the workers' CPU time
 * in their pieces (the gain) against the caller's waits for their pieces and
 * its own time off its CPU in the share the workers ran on the caller's CPU
 * (the harm), decayed over the last ~8 ms of dispatches. When the harm
 * exceeds the gain, a solo period starts: every dispatch runs on the caller
 * alone (fn(ctx, 0, n, 0), as with a NULL pool, so the same results; the
 * workers sleep instead of being woken for the odd dispatch) for 8 times the
 * last dispatch's wait for its workers, or twice the last period when the
 * workers lost their trial after it (4 to 100 ms), then the workers are
 * tried again; a period that began with no CPU free for the workers (the
 * running count of /proc/loadavg) ends as soon as one is. A one-off stall
 * of a few milliseconds in a long prefill does not start one: the work
 * around it outweighs it. Only a claimed dispatch starts one; a profiled
 * pool (jlm_pool_profile) never does, so a profile shows the dispatches as
 * split. Env JLM_POOL: "claim" turns the solo periods off, "static" also
 * splits claimed dispatches as jlm_pool_for does (the A/B baselines of
 * docs/bench.md). jlm_pool_stalls: the solo periods started so far;
 * jlm_pool_solo_ns: the wall time they covered, the one in force up to now
 * (both 0 for NULL; jlm run --stats, jlm bench print them). */
unsigned long long jlm_pool_stalls(const jlm_pool *p);
unsigned long long jlm_pool_solo_ns(const jlm_pool *p);

/* Profiling (jlm bench --profile). While on, every dispatch that reaches the
 * workers is timed: its wall time, and per thread the time it did not run
 * its slice (a worker: from the dispatch to its slice's start, then from its
 * slice's end to the dispatch's end; the caller: from its slice's end to the
 * last worker's). wait_ns sums that over the threads: the cost of the
 * dispatch's barrier. Off (the default): no clock is read. Counters are
 * read and reset by the dispatching thread between dispatches. */
typedef struct jlm_pool_stats {
    unsigned long long dispatches;   /* dispatches that reached the workers */
    unsigned long long wall_ns;      /* their wall time, summed */
    unsigned long long wait_ns;      /* thread time spent waiting in them, summed over threads */
    unsigned long long busy_ns;      /* thread time spent in slices, summed over threads */
} jlm_pool_stats;
void jlm_pool_profile(jlm_pool *p, int on);
void jlm_pool_stats_get(const jlm_pool *p, jlm_pool_stats *out);
void jlm_pool_stats_reset(jlm_pool *p);

#endif

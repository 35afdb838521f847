/* scratch.c - the batch scratch's rows (model_int.h): each buffer of nb
 * rows is reserved whole as address space (MAP_NORESERVE: no memory until
 * written) and backed and counted row by row as batches reach its rows,
 * as the KV cache is by positions (kvcache.c). A decoded token uses row 0
 * of each; a prefill of n tokens rows [0, min(n, nb)). What the rows hold
 * is counted in mem_scratch, so the page frames' budget gives up what a
 * prefill's rows take and, under a budget, gets it back when a smaller
 * batch follows (the rows past it, and past BATCH, are given back to the
 * kernel). */
#include "engine/model_int.h"

#include <sys/mman.h>
#include <unistd.h>

static uint64_t pages_up(uint64_t n)
{
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

/* The address space buffer i holds: nb rows, at least a page. */
static uint64_t reserved(const jlm_engine *e, int i)
{
    uint64_t n = pages_up((uint64_t)e->nb * e->rowbuf[i].row);
    return n ? n : pages_up(1);
}

void *jlm_mem_reserve(uint64_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    madvise(p, n, MADV_NOHUGEPAGE);   /* a first write takes a page, not 2 MiB (the counts are by page) */
    return p;
}

void *jlm_rows_reserve(jlm_engine *e, uint64_t row)
{
    if (e->n_rowbuf >= ROW_BUFS)
        return NULL;
    e->rowbuf[e->n_rowbuf].row = row;
    void *p = jlm_mem_reserve(reserved(e, e->n_rowbuf));
    if (p)
        e->rowbuf[e->n_rowbuf++].p = p;
    return p;
}

void jlm_rows_release(jlm_engine *e)
{
    for (int i = 0; i < e->n_rowbuf; i++)
        munmap(e->rowbuf[i].p, reserved(e, i));
    e->n_rowbuf = 0;
}

uint64_t jlm_rows_bytes(const jlm_engine *e)
{
    uint64_t sum = 0;
    for (int i = 0; i < e->n_rowbuf; i++)
        sum += pages_up((uint64_t)e->rows_have * e->rowbuf[i].row);
    return sum;
}

int jlm_rows_fit(jlm_engine *e, uint32_t need, jlm_err *err)
{
    if (need > e->nb)
        need = e->nb;
    if (need < 1)
        need = 1;
    /* shrink only under a budget (without one nothing is gained by giving
     * the rows back, and the next prefill would fault them in again), and
     * never below BATCH rows once reached: serve's batched steps (up to
     * BATCH rows) between single ones would otherwise move the frames'
     * budget, and a chunk of a page with it, at every step */
    if (need < e->rows_have) {
        uint32_t keep = e->rows_have < BATCH ? e->rows_have : BATCH;
        need = need > keep ? need : keep;
    }
    if (need == e->rows_have || (need < e->rows_have && !e->budget_all))
        return JLM_OK;
    uint32_t old = e->rows_have;
    e->rows_have = need;
    e->mem_scratch = e->scratch_heap + jlm_rows_bytes(e);
    for (int i = 0; need < old && i < e->n_rowbuf; i++) {
        uint64_t a = pages_up((uint64_t)need * e->rowbuf[i].row), b = pages_up((uint64_t)old * e->rowbuf[i].row);
        if (b > a)
            madvise((uint8_t *)e->rowbuf[i].p + a, b - a, MADV_DONTNEED);
    }
    int rc = jlm_eng_fit_frames(e, err);
    if (rc && need > old) {
        e->rows_have = old;
        e->mem_scratch = e->scratch_heap + jlm_rows_bytes(e);
        jlm_err e2;
        jlm_eng_fit_frames(e, &e2);   /* the budget it had: fits as before */
    }
    return rc;
}

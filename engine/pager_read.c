/* pager_read.c - the pager's reader threads, kept out of pager.c: each
 * takes a queued prefetch slot and reads its runs into the frame it was
 * given (jlm_pgr_run; the engine thread collects them in pager.c, and runs
 * the read itself for a slot it must wait for that no reader has taken),
 * started on demand up to the read depth; and the prefault every read into
 * a frame makes first (see pager.h, "Prefetch", and the top of pager.c). */
#include "engine/pager_int.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>

/* Maps in the frame's pages of [q, q+n) before a read lands there, in one
 * call (MADV_POPULATE_WRITE, Linux 5.14). Without it a buffered read (a view
 * through jlmfs, --no-direct) faults each 4 KiB page of a fresh frame inside
 * copy_to_iter, one exception each: in a VM that was 24% of a run through
 * the mount. The read overwrites the pages, so nothing else changes; an older
 * kernel (EINVAL) just faults them as before. */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
void jlm_pgr_prefault(uint8_t *q, uint64_t n)
{
    uintptr_t a = (uintptr_t)q & ~(uintptr_t)4095, b = ((uintptr_t)q + n + 4095) & ~(uintptr_t)4095;
    if (b > a)
        (void)madvise((void *)a, b - a, MADV_POPULATE_WRITE);
}

int jlm_pgr_run(jlm_pager *p, const pfslot *s, jlm_err *err)
{
    int rc = 0;
    for (uint32_t i = 0; i < s->n_runs && !rc; i++) {
        const pfrun *u = &s->runs[i];   /* not changed while READING */
        jlm_pgr_prefault(s->dst + u->lo, u->hi - u->lo);
        rc = p->src->read(p->src, s->base + u->lo, (size_t)(u->hi - u->lo), s->dst + u->lo, err);
    }
    return rc;
}

/* A reader thread: takes any queued slot and reads its runs in order into
 * the frame it was given (jlm_pgr_run). */
static void *pf_main(void *arg)
{
    jlm_pager *p = arg;
    pfetch *f = &p->pf;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        pfslot *s = NULL;
        while (!f->stop && !s) {
            for (uint32_t i = 0; i < PF_SLOTS && !s; i++)
                if (f->slot[i].state == PF_QUEUED)
                    s = &f->slot[i];
            if (!s && !f->stop)
                pthread_cond_wait(&f->cv, &f->mu);
        }
        if (f->stop)
            break;
        s->state = PF_READING;
        pthread_mutex_unlock(&f->mu);
        jlm_err err = {0};
        int rc = jlm_pgr_run(p, s, &err);
        pthread_mutex_lock(&f->mu);
        s->rc = rc;
        s->err = err;
        s->state = PF_DONE;
        pthread_cond_broadcast(&f->done);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

/* A free slot with a reader thread for it (started here), or NULL. Without
 * any thread (pthread_create failed; JLM_PAGER_NO_THREADS=1 when the pager
 * was made, the tests' seam for it) prefetch turns off: every read is the get's, in turn. */
pfslot *jlm_pgr_free_slot(jlm_pager *p)
{
    pfetch *f = &p->pf;
    if (f->busy >= f->depth)
        return NULL;
    while (f->n_threads < f->depth && f->n_threads < f->busy + 1) {
        if (f->no_threads || pthread_create(&f->th[f->n_threads], NULL, pf_main, p) != 0)
            break;
        f->n_threads++;
    }
    if (!f->n_threads) {
        p->pf_on = 0;   /* no thread: reads stay on the engine thread */
        return NULL;
    }
    for (uint32_t i = 0; i < PF_SLOTS; i++)
        if (!f->slot[i].pg)
            return &f->slot[i];
    return NULL;
}

void jlm_pager_set_prefetch_depth(jlm_pager *p, uint32_t depth)
{
    p->pf.depth = depth < 1 ? 1 : depth > PF_SLOTS ? PF_SLOTS : depth;
}

/* pager_conf.c - the pager's configuration, kept out of pager.c: each
 * array's description checked (jlm_pager_open's refusals) and its records
 * laid out, the transparent huge page size the engine's chunk follows
 * (see pager.h and the top of pager.c for why huge pages), the minimum
 * budget and the hooks. */
#include "engine/pager_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int jlm_pgc_check_desc(const jlm_pager_config *cfg, uint32_t a, uint64_t *frame_len, jlm_err *err)
{
    const jlm_pager_array_desc *d = &cfg->arrays[a];
    const char *nm = d->name ? d->name : "?";
    if (!d->name || (d->cls != JLM_PAGER_BLOCK && d->cls != JLM_PAGER_EXPERT))
        return jlm_errf(err, JLM_EINVAL, "pager: array %u (%s): no name or class %d unknown", a, nm, d->cls);
    if (d->n_pages == 0) {                   /* an empty array (no tower, dense model) */
        *frame_len = PAGER_ALIGN;
        return 0;
    }
    if (d->base_off % PAGER_ALIGN || d->page_size == 0 || d->page_size % PAGER_ALIGN)
        return jlm_errf(err, JLM_EINVAL, "pager: %s: base %llu / page size %llu not a nonzero multiple of 4096",
                        nm, (unsigned long long)d->base_off, (unsigned long long)d->page_size);
    uint64_t max = 0;
    for (uint32_t i = 0; i < d->n_pages; i++) {
        uint64_t e = d->extent ? d->extent[i] : d->page_size;
        if (e % PAGER_ALIGN || e > d->page_size)
            return jlm_errf(err, JLM_EINVAL, "pager: %s page %u: extent %llu, expected a multiple of 4096 <= page size %llu",
                            nm, i, (unsigned long long)e, (unsigned long long)d->page_size);
        if (e > max)
            max = e;
    }
    uint64_t size = cfg->src->size;
    if (d->n_pages && (d->base_off > size || (uint64_t)(d->n_pages - 1) > (size - d->base_off) / d->page_size ||
                       max > size - d->base_off - (uint64_t)(d->n_pages - 1) * d->page_size))
        return jlm_errf(err, JLM_EINVAL, "pager: %s: %u pages of %llu bytes at %llu end past %s (%llu bytes)",
                        nm, d->n_pages, (unsigned long long)d->page_size, (unsigned long long)d->base_off,
                        cfg->src->name, (unsigned long long)size);
    *frame_len = max < PAGER_ALIGN ? PAGER_ALIGN : max;
    return 0;
}

int jlm_pgc_init_array(jlm_pager *p, const jlm_pager_array_desc *d, uint32_t a, uint64_t frame_len, jlm_err *err)
{
    parray *r = &p->arr[a];
    snprintf(r->name, sizeof r->name, "%s", d->name);
    r->cls = d->cls;
    r->base_off = d->base_off;
    r->page_size = d->page_size;
    r->frame_len = frame_len;
    r->map_len = p->thp ? jlm_pg_huge_end(p, frame_len) : frame_len;
    r->n_pages = d->n_pages;
    r->words = (uint32_t)(((frame_len + p->chunk - 1) / p->chunk + 63) / 64);
    size_t n = d->n_pages ? d->n_pages : 1;
    r->extent = calloc(n, sizeof *r->extent);
    r->pages = calloc(n, sizeof *r->pages);
    r->bitmap = (size_t)r->words > SIZE_MAX / 8 / n ? NULL : calloc(n * r->words, sizeof *r->bitmap);
    if (!r->extent || !r->pages || !r->bitmap)
        return jlm_errf(err, JLM_ENOMEM, "pager: %s: out of memory for %u page records", r->name, d->n_pages);
    for (uint32_t i = 0; i < d->n_pages; i++) {
        r->extent[i] = d->extent ? d->extent[i] : d->page_size;
        r->pages[i].bits = r->bitmap + (size_t)i * r->words;
        r->pages[i].array = a;
        r->pages[i].idx = i;
        r->pages[i].xp_key = JLM_XP_KEY_NONE;
    }
    return 0;
}

static uint64_t thp_cached;
static pthread_once_t thp_once = PTHREAD_ONCE_INIT;

static void thp_probe(void)
{
    uint64_t sz = 0;
    char mode[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f) {
        if (!fgets(mode, sizeof mode, f))
            mode[0] = 0;
        fclose(f);
    }
    f = fopen("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "r");
    unsigned long long v = 0;
    if (f) {
        if (fscanf(f, "%llu", &v) != 1)
            v = 0;
        fclose(f);
    }
    /* "always [madvise] never": usable unless never is the one chosen; sizes
     * past 32 MiB (a 64 KiB-page arm64 kernel's 512 MiB) would make chunks
     * too coarse for partial frames */
    if ((strstr(mode, "[always]") || strstr(mode, "[madvise]")) && v >= PAGER_ALIGN && v <= (32ull << 20) &&
        (v & (v - 1)) == 0)
        sz = v;
    thp_cached = sz;
}

uint64_t jlm_pager_thp_size(void)
{
    pthread_once(&thp_once, thp_probe);
    return thp_cached;
}

uint64_t jlm_pager_chunk_for(uint64_t chunk)
{
    uint64_t thp = jlm_pager_thp_size();
    return thp > chunk && (chunk == 0 || thp % chunk == 0) ? thp : chunk;
}

uint64_t jlm_pager_min_budget(const jlm_pager *p, const uint32_t *n_pinned)
{
    uint64_t s = 0;
    for (uint32_t a = 0; a < p->n_arrays; a++)
        s += (uint64_t)n_pinned[a] * (jlm_pg_one_huge(p, p->arr[a].frame_len) ? p->arr[a].map_len : p->arr[a].frame_len);
    return s;
}

void jlm_pager_set_evict_hook(jlm_pager *p, jlm_pager_evict_fn fn, void *ctx)
{
    p->evict_fn = fn;
    p->evict_ctx = ctx;
}

void jlm_pager_set_events(jlm_pager *p, jlm_pager_event_fn fn, void *ctx)
{
    p->ev_fn = fn;
    p->ev_ctx = ctx;
}

/* model_pages.c - a container's page arrays as the pager sees them: the
 * mapping from the .jlm header (jlm-format.md) to jlm_pager_array_desc, kept
 * out of pager.c so the pager knows nothing of the container format. */
#include "engine/model.h"

#include <stdlib.h>

int jlm_pager_open_model(const jlm_model *m, jlm_source *src, uint64_t budget,
                         jlm_pager **out, jlm_err *err)
{
    const jlm_header *h = &m->hdr;
    uint32_t n[3] = { h->n_blocks, h->n_vis_blocks, h->n_exp_pages };
    int region[3] = { JLM_REG_TEXT, JLM_REG_VISION, JLM_REG_EXPERT };
    uint64_t *ext[3] = { NULL, NULL, NULL };
    jlm_pager_array_desc d[3] = {
        { .name = "blocks", .cls = JLM_PAGER_BLOCK, .base_off = h->data_off, .page_size = h->page_size },
        { .name = "vision", .cls = JLM_PAGER_BLOCK, .base_off = h->vis_data_off, .page_size = h->vis_page_size },
        { .name = "experts", .cls = JLM_PAGER_EXPERT, .base_off = h->exp_data_off, .page_size = h->exp_page_size },
    };
    int rc = 0;
    for (int a = 0; a < 3 && !rc; a++) {
        d[a].n_pages = n[a];
        if (n[a] == 0) {
            d[a].base_off = 0;
            d[a].page_size = 4096;   /* the pager's frame alignment */
            continue;
        }
        ext[a] = malloc((size_t)n[a] * sizeof *ext[a]);
        if (!ext[a]) {
            rc = jlm_errf(err, JLM_ENOMEM, "%s: out of memory for %u page extents", m->path, n[a]);
            break;
        }
        for (uint32_t i = 0; i < n[a]; i++)
            ext[a][i] = jlm_fmt_page_extent(m, region[a], i);
        d[a].extent = ext[a];
    }
    if (!rc) {
        jlm_pager_config cfg = { .src = src, .chunk = jlm_pager_chunk_for(h->chunk), .budget = budget, .n_arrays = 3, .arrays = d };
        rc = jlm_pager_open(&cfg, out, err);
        if (rc)
            jlm_err_prefix(err, rc, "%s", m->path);
    }
    for (int a = 0; a < 3; a++)
        free(ext[a]);
    return rc;
}

/* routing.h - a routing trace read back (the file `jlm run --trace-routing`
 * writes, model.h: jlm_engine_trace_routing): the background read's order
 * (jlm_engine_warm_order) and bench/routing_replay's replay. */
#ifndef JLM_ENGINE_ROUTING_H
#define JLM_ENGINE_ROUTING_H

#include "base/jlm_err.h"

#include <stdint.h>
#include <stdio.h>

typedef struct jlm_routing_trace {
    uint32_t  n_layer, n_expert, n_used;   /* the header's */
    uint64_t  expert_bytes;                /* the header's mean expert page */
    uint32_t  n_groups;     /* lines: one (position, block) each */
    uint32_t  n_tokens;     /* distinct positions */
    uint32_t *page;         /* (n_groups * n_used,) block * n_expert + id, the
                             * lines sorted by (position, block), stably:
                             * decode's order */
} jlm_routing_trace;

/* Parses a trace from f. The file is untrusted: a refusal is JLM_EFORMAT
 * (JLM_EIO for a read error, JLM_ENOMEM) with one line "NAME:LINE: why" in
 * err, and *t zeroed; limits: n_layer and n_expert <= 65536, their product
 * <= 2^24, lines of 4095 bytes, 2^26 lines. */
int jlm_routing_parse(FILE *f, const char *name, jlm_routing_trace *t, jlm_err *err);
void jlm_routing_free(jlm_routing_trace *t);

/* The np expert pages in order of their routings in t, most routed first,
 * ties and the never routed in page order, into order (np entries). rank
 * (t->n_layer entries): a layer's MoE ordinal (its pages are rank x
 * n_expert + id), UINT32_MAX for a layer without routed experts (its
 * lines are passed over). JLM_EINVAL when a rank's pages pass np, or
 * JLM_ENOMEM; order untouched then. */
int jlm_routing_order(const jlm_routing_trace *t, const uint32_t *rank, uint32_t np, uint32_t *order,
                      jlm_err *err);

#endif

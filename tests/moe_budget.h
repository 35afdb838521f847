/* moe_budget.h - a MoE test model's budget that holds its blocks and a third
 * of its experts, for the suites that test paging and the read-ahead's gate
 * under it (moe, cuda). Header-only (static inline). */
#ifndef JLM_TESTS_MOE_BUDGET_H
#define JLM_TESTS_MOE_BUDGET_H

#include <criterion/criterion.h>

#include "engine/model.h"
#include "engine/pager.h"

/* From e after an unlimited run: its KV cache, scratch and dense region, the
 * text blocks it paged in and a third of the experts it paged in. */
static inline uint64_t tb_third_of_the_experts(jlm_engine *e)
{
    jlm_pager_counters pc;
    jlm_pager_stats(jlm_engine_pager(e), &pc);
    jlm_engine_mem mi;
    jlm_engine_mem_info(e, &mi);
    return mi.kv + mi.scratch + mi.dense + pc.a[JLM_PAGER_TEXT].resident_bytes +
           pc.a[JLM_PAGER_EXPERTS].resident_bytes / 3;
}

/* After a run under a budget: the frames never held more than it, and the
 * pager's invariants hold (jlm_pager_check). */
static inline void tb_within_budget(jlm_engine *e)
{
    jlm_pager_counters pc;
    jlm_pager_stats(jlm_engine_pager(e), &pc);
    cr_assert(pc.peak_bytes <= jlm_engine_budget(e), "resident %llu within budget %llu",
              (unsigned long long)pc.peak_bytes, (unsigned long long)jlm_engine_budget(e));
    cr_assert_eq(jlm_pager_check(jlm_engine_pager(e), NULL), 0);
}

#endif

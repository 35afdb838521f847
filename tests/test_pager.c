/* test_pager.c - page sources, the thread pool and the pager.
 *
 * The pager is tested without a container: page arrays are described as
 * (base, page size, pages, extents) over a memory or file source whose byte
 * at offset i is content_byte(i), so every byte handed out can be checked
 * against where it must have come from. jlm_pager_check runs after every
 * operation. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/testutil.h"
#include "engine/model.h"
#include "engine/pager.h"
#include "engine/pool.h"
#include "engine/source.h"
#include "engine/xpolicy.h"
#include "format/jlm_format.h"

/* ---------------------------------------------------------------- fixtures */
static uint8_t content_byte(uint64_t i)
{
    uint64_t z = i * 0x9E3779B97F4A7C15ull;
    return (uint8_t)((z >> 29) ^ (z >> 47) ^ i);
}

static uint8_t *make_content(size_t n)
{
    uint8_t *b = malloc(n);
    cr_assert(b);
    for (size_t i = 0; i < n; i++)
        b[i] = content_byte(i);
    return b;
}

static void check_bytes(const void *got, uint64_t off, size_t len, const char *what)
{
    const uint8_t *g = got;
    for (size_t i = 0; i < len; i++)
        if (g[i] != content_byte(off + i))
            cr_assert_fail("%s: byte at source offset %llu is %u, expected %u", what,
                           (unsigned long long)(off + i), g[i], content_byte(off + i));
}

#define PG 16384u          /* block page size */
#define XPG 8192u          /* expert page size */
#define NB 6u              /* block pages */
#define NX 8u              /* expert pages */
#define BLK_BASE 8192u
#define EXP_BASE (BLK_BASE + NB * PG)
#define SRC_LEN (EXP_BASE + NX * XPG)

typedef struct rig {
    uint8_t          *data;
    jlm_source       *mem;
    jlm_fault_source *fs;
    jlm_pager        *p;
    /* event log */
    int               n_ev;
    jlm_pager_event   ev[512];
} rig;

static void on_event(void *ctx, const jlm_pager_event *e)
{
    rig *r = ctx;
    if (r->n_ev < 512)
        r->ev[r->n_ev++] = *e;
}

static void rig_open_x(rig *r, uint64_t budget_blocks, uint64_t budget_experts, const uint64_t *blk_extent,
                       const uint64_t *xp_extent)
{
    memset(r, 0, sizeof *r);
    jlm_err err = { 0 };
    r->data = make_content(SRC_LEN);
    cr_assert_eq(jlm_source_open_mem(r->data, SRC_LEN, "mem.jlm", &r->mem, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_source_open_fault(r->mem, &r->fs, &err), 0, "%s", err.msg);
    jlm_pager_array_desc arrays[2] = {
        { .name = "blocks", .cls = JLM_PAGER_BLOCK, .base_off = BLK_BASE, .page_size = PG,
          .n_pages = NB, .extent = blk_extent },
        { .name = "experts", .cls = JLM_PAGER_EXPERT, .base_off = EXP_BASE, .page_size = XPG,
          .n_pages = NX, .extent = xp_extent },
    };
    jlm_pager_config cfg = { .src = &r->fs->base, .chunk = 4096, .n_arrays = 2, .arrays = arrays,
                             .budget = budget_blocks * PG + budget_experts * XPG };
    cr_assert_eq(jlm_pager_open(&cfg, &r->p, &err), 0, "%s", err.msg);
    jlm_pager_set_events(r->p, on_event, r);
}

static void rig_open(rig *r, uint64_t budget_blocks, uint64_t budget_experts, const uint64_t *blk_extent)
{
    rig_open_x(r, budget_blocks, budget_experts, blk_extent, NULL);
}

static void rig_close(rig *r)
{
    jlm_pager_close(r->p);
    jlm_source_close(&r->fs->base);
    jlm_source_close(r->mem);
    free(r->data);
}

static void check(rig *r)
{
    jlm_err err = { 0 };
    cr_assert_eq(jlm_pager_check(r->p, &err), 0, "invariant broken: %s", err.msg);
}

static uint64_t page_off(uint32_t array, uint32_t page)
{
    return array == 0 ? BLK_BASE + (uint64_t)page * PG : EXP_BASE + (uint64_t)page * XPG;
}

/* get + byte check + check(); returns the pointer. */
static const uint8_t *get_ok(rig *r, uint32_t array, uint32_t page, uint64_t off, uint64_t len)
{
    jlm_err err = { 0 };
    const void *ptr = NULL;
    int rc = jlm_pager_get(r->p, array, page, off, len, &ptr, &err);
    cr_assert_eq(rc, 0, "get array %u page %u [%llu,+%llu): rc %d: %s", array, page,
                 (unsigned long long)off, (unsigned long long)len, rc, err.msg);
    check_bytes(ptr, page_off(array, page) + off, (size_t)len, "pager get");
    check(r);
    return ptr;
}

static void use(rig *r, uint32_t array, uint32_t page, uint64_t len)
{
    get_ok(r, array, page, 0, len);
    jlm_pager_unpin(r->p, array, page);
    check(r);
}

/* Pages evicted so far, in order, of one array. */
static int evictions(const rig *r, uint32_t array, uint32_t *out, int max)
{
    int n = 0;
    for (int i = 0; i < r->n_ev; i++)
        if (r->ev[i].kind == JLM_PAGER_EV_EVICT && r->ev[i].array == array && n < max)
            out[n++] = r->ev[i].page;
    return n;
}

/* ---------------------------------------------------------------- pager */
Test(pager, never_evicts_a_page_in_use, .timeout = 10)
{
    rig r;
    rig_open(&r, 2, 0, NULL);
    const uint8_t *p0 = get_ok(&r, 0, 0, 0, PG);            /* pinned throughout */
    use(&r, 0, 1, PG);
    use(&r, 0, 2, PG);                                       /* must evict 1, not 0 */
    uint32_t ev[8];
    int n = evictions(&r, 0, ev, 8);
    cr_assert_eq(n, 1, "evictions: %d, expected 1", n);
    cr_assert_eq(ev[0], 1, "evicted block %u, expected 1 (0 is pinned)", ev[0]);
    cr_assert(jlm_pager_resident(r.p, 0, 0));
    check_bytes(p0, page_off(0, 0), PG, "pinned page after eviction");

    get_ok(&r, 0, 2, 0, PG);                                 /* now both frames pinned */
    jlm_err err = { 0 };
    const void *ptr = NULL;
    int rc = jlm_pager_get(r.p, 0, 3, 0, PG, &ptr, &err);
    cr_assert_eq(rc, JLM_ERANGE, "get with every frame pinned: rc %d, expected JLM_ERANGE", rc);
    cr_assert(strstr(err.msg, "min_budget"), "message does not say how to fix it: %s", err.msg);
    cr_assert_null(ptr);
    check(&r);
    cr_assert(jlm_pager_resident(r.p, 0, 0) && jlm_pager_resident(r.p, 0, 2));
    cr_assert(!jlm_pager_resident(r.p, 0, 3));
    check_bytes(p0, page_off(0, 0), PG, "pinned page after a refused get");
    jlm_pager_unpin(r.p, 0, 0);
    jlm_pager_unpin(r.p, 0, 2);
    check(&r);
    rig_close(&r);
}

Test(pager, evicts_the_least_recently_used_expert_before_any_block, .timeout = 10)
{
    rig r;
    rig_open(&r, 1, 3, NULL);
    use(&r, 0, 0, PG);
    use(&r, 1, 0, XPG);
    use(&r, 1, 1, XPG);
    use(&r, 1, 2, XPG);
    use(&r, 1, 0, XPG);          /* expert 0 is now the most recent */
    use(&r, 1, 3, XPG);          /* LRU expert: 1 */
    use(&r, 1, 4, XPG);          /* LRU expert: 2 */
    use(&r, 1, 0, XPG);          /* hit */
    use(&r, 1, 5, XPG);          /* LRU expert: 3 */
    uint32_t ev[8];
    int n = evictions(&r, 1, ev, 8);
    uint32_t want[3] = { 1, 2, 3 };
    cr_assert_eq(n, 3, "expert evictions: %d, expected 3", n);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(ev[i], want[i], "eviction %d: expert %u, expected %u", i, ev[i], want[i]);
    cr_assert_eq(evictions(&r, 0, ev, 8), 0, "a block was evicted while experts were evictable");
    cr_assert(jlm_pager_resident(r.p, 0, 0));
    rig_close(&r);
}

/* An expert read that evicts an expert of the same extent takes its frame
 * over: the same addresses (a hypervisor shadowing the guest's page tables
 * then charges no first touch per 4 KiB page again: docs/pager.md, Expert
 * frames), the new page's bytes, the budget and the invariants kept, one
 * eviction counted and its event sent. A partial get of a taken frame gives
 * back the rest of it. With the experts pinned the read evicts a block and
 * maps a frame of its own. */
Test(pager, an_expert_read_that_evicts_an_expert_takes_over_its_frame, .timeout = 10)
{
    rig r;
    rig_open(&r, 1, 2, NULL);
    jlm_pager_set_expert_policy(r.p, JLM_XP_LRU, 1);
    use(&r, 0, 0, PG);
    const uint8_t *a = get_ok(&r, 1, 0, 0, XPG);
    jlm_pager_unpin(r.p, 1, 0);
    const uint8_t *b = get_ok(&r, 1, 1, 0, XPG);
    jlm_pager_unpin(r.p, 1, 1);
    const uint8_t *c = get_ok(&r, 1, 2, 0, XPG);   /* evicts expert 0 (LRU) */
    cr_assert_eq(c, a, "expert 2 at %p, expert 0's frame was %p", (const void *)c, (const void *)a);
    cr_assert(!jlm_pager_resident(r.p, 1, 0) && jlm_pager_resident(r.p, 0, 0));
    uint32_t ev[8];
    cr_assert_eq(evictions(&r, 1, ev, 8), 1);
    cr_assert_eq(ev[0], 0);
    jlm_pager_counters st;
    jlm_pager_stats(r.p, &st);
    cr_assert_eq(st.a[1].evictions, 1);
    cr_assert_eq(st.a[1].resident_pages, 2);
    cr_assert_eq(st.a[1].resident_bytes, 2 * XPG);
    jlm_pager_unpin(r.p, 1, 2);
    check(&r);
    const uint8_t *d = get_ok(&r, 1, 3, 0, 4096);   /* a part: evicts 1 (LRU), keeps one chunk of its frame */
    cr_assert_eq(d, b, "expert 3 at %p, expert 1's frame was %p", (const void *)d, (const void *)b);
    jlm_pager_unpin(r.p, 1, 3);
    check(&r);
    get_ok(&r, 1, 2, 0, XPG);
    get_ok(&r, 1, 3, 0, XPG);
    const uint8_t *e = get_ok(&r, 1, 4, 0, XPG);    /* both experts pinned: the block goes */
    cr_assert(e != a && e != b);
    cr_assert(jlm_pager_filled(r.p, 0, 0) < PG, "block 0 keeps %llu bytes", (unsigned long long)jlm_pager_filled(r.p, 0, 0));
    jlm_pager_unpin(r.p, 1, 2);
    jlm_pager_unpin(r.p, 1, 3);
    jlm_pager_unpin(r.p, 1, 4);
    check(&r);
    rig_close(&r);
}

/* The same across extents (Q4_K_M's blocks differ: some experts' down
 * matrices are Q6_K): a read whose victim is a smaller expert takes its
 * frame and evicts nothing more when that freed enough; one whose victim is
 * larger takes its frame and gives back the part past its own extent
 * (invariant 8, check); the bytes read are the page's either way. */
Test(pager, an_expert_read_takes_over_the_frame_of_an_expert_of_another_extent, .timeout = 10)
{
    static const uint64_t ext[NX] = {4096, XPG, XPG, 4096, XPG, XPG, XPG, XPG};
    rig r;
    rig_open_x(&r, 1, 2, NULL, ext);
    jlm_pager_set_expert_policy(r.p, JLM_XP_LRU, 1);
    use(&r, 0, 0, PG);
    const uint8_t *a = get_ok(&r, 1, 0, 0, 4096);
    jlm_pager_unpin(r.p, 1, 0);
    const uint8_t *b = get_ok(&r, 1, 1, 0, XPG);
    jlm_pager_unpin(r.p, 1, 1);
    const uint8_t *c = get_ok(&r, 1, 2, 0, XPG);   /* evicts expert 0 (4096 bytes): that is room enough */
    cr_assert_eq(c, a, "expert 2 at %p, expert 0's smaller frame was %p", (const void *)c, (const void *)a);
    cr_assert(jlm_pager_resident(r.p, 1, 1) && jlm_pager_resident(r.p, 0, 0), "more than expert 0 evicted");
    jlm_pager_unpin(r.p, 1, 2);
    check(&r);
    const uint8_t *d = get_ok(&r, 1, 3, 0, 4096);   /* evicts expert 1 (XPG): the rest of its frame goes */
    cr_assert_eq(d, b, "expert 3 at %p, expert 1's larger frame was %p", (const void *)d, (const void *)b);
    jlm_pager_counters st;
    jlm_pager_stats(r.p, &st);
    cr_assert_eq(st.a[1].evictions, 2);
    cr_assert_eq(st.a[1].resident_bytes, XPG + 4096);
    jlm_pager_unpin(r.p, 1, 3);
    check(&r);
    rig_close(&r);
}

/* Experts of two extents (4096 and XPG bytes) at a full budget of four
 * XPG: an XPG read passes over the least recent expert when it is smaller
 * and one of its own extent ranks next (no more than a quarter of the
 * candidates above it): that one goes alone and its frame is taken whole,
 * where the smaller victim would have given too little room and cost a
 * second eviction. When the fitting one ranks further back, the policy's
 * victims go as before. */
static const uint64_t two_sizes[NX] = {4096, XPG, XPG, XPG, XPG, 4096, 4096, 4096};

Test(pager, an_expert_read_evicts_one_of_its_own_extent_when_it_ranks_next_to_the_policys_victim, .timeout = 10)
{
    rig r;
    rig_open_x(&r, 0, 4, NULL, two_sizes);
    jlm_pager_set_expert_policy(r.p, JLM_XP_LRU, 1);
    use(&r, 1, 0, 4096);
    const uint8_t *one = get_ok(&r, 1, 1, 0, XPG);
    jlm_pager_unpin(r.p, 1, 1);
    use(&r, 1, 2, XPG);
    use(&r, 1, 3, XPG);
    use(&r, 1, 5, 4096);   /* least recent first: 0 (4096), 1, 2, 3, 5 (4096); 32768 bytes */
    const uint8_t *four = get_ok(&r, 1, 4, 0, XPG);
    uint32_t ev[8];
    int n = evictions(&r, 1, ev, 8);
    cr_assert_eq(n, 1, "%d experts evicted, expected 1 (expert 1)", n);
    cr_assert_eq(ev[0], 1, "expert %u evicted, expected 1 (the least recent of expert 4's extent)", ev[0]);
    cr_assert_eq(four, one, "expert 4 at %p, expert 1's frame was %p", (const void *)four, (const void *)one);
    cr_assert(jlm_pager_resident(r.p, 1, 0) && jlm_pager_resident(r.p, 1, 5), "a smaller expert evicted");
    jlm_pager_unpin(r.p, 1, 4);
    check(&r);
    rig_close(&r);
}

Test(pager, an_expert_read_evicts_the_policys_victims_when_its_own_extent_ranks_far_back, .timeout = 10)
{
    rig r;
    rig_open_x(&r, 0, 4, NULL, two_sizes);
    jlm_pager_set_expert_policy(r.p, JLM_XP_LRU, 1);
    use(&r, 1, 0, 4096);
    use(&r, 1, 5, 4096);
    use(&r, 1, 6, 4096);
    use(&r, 1, 7, 4096);
    use(&r, 1, 1, XPG);
    use(&r, 1, 2, XPG);   /* least recent first: 0, 5, 6, 7 (4096 each), 1, 2; 32768 bytes */
    use(&r, 1, 3, XPG);   /* expert 1 has 4 of 6 candidates above it: LRU's 0, then 5 for the rest */
    uint32_t ev[8];
    int n = evictions(&r, 1, ev, 8);
    cr_assert_eq(n, 2, "%d experts evicted, expected 2 (experts 0 and 5)", n);
    cr_assert(ev[0] == 0 && ev[1] == 5, "experts %u and %u evicted, expected 0 and 5", ev[0], ev[1]);
    cr_assert(jlm_pager_resident(r.p, 1, 1) && jlm_pager_resident(r.p, 1, 2), "an expert of the read's extent evicted");
    rig_close(&r);
}

/* Expert 0 gotten three times, then 1 and 2 once: at a budget of three
 * experts, expert 3's read evicts the least recently used (0) under LRU and
 * the lowest count (1; 2 ties with it and is more recent) under LFU with
 * counts that do not decay in this run. */
static uint32_t first_expert_victim(int policy)
{
    rig r;
    rig_open(&r, 0, 3, NULL);
    if (policy >= 0)
        jlm_pager_set_expert_policy(r.p, policy, 1e9);
    for (uint32_t x = 0; x < 3; x++)
        use(&r, 1, 0, XPG);
    use(&r, 1, 1, XPG);
    use(&r, 1, 2, XPG);
    use(&r, 1, 3, XPG);
    uint32_t ev[8];
    int n = evictions(&r, 1, ev, 8);
    cr_assert_eq(n, 1, "expert evictions: %d, expected 1", n);
    rig_close(&r);
    return ev[0];
}

Test(pager, the_expert_policy_picks_the_victim_lru_the_least_recent_lfu_the_least_counted, .timeout = 10)
{
    cr_assert_eq(first_expert_victim(-1), 0, "default (LRU) evicted %u, expected 0", first_expert_victim(-1));
    cr_assert_eq(first_expert_victim(JLM_XP_LRU), 0, "LRU evicted %u, expected 0", first_expert_victim(JLM_XP_LRU));
    cr_assert_eq(first_expert_victim(JLM_XP_LFU), 1, "LFU evicted %u, expected 1", first_expert_victim(JLM_XP_LFU));
}

Test(pager, a_cyclic_scan_keeps_every_block_in_part_at_a_whole_frame_budget, .timeout = 10)
{
    rig r;
    rig_open(&r, 3, 0, NULL);   /* 5 blocks of 4 chunks, 12 chunks of budget */
    /* pass 1: 0,1,2 fill the budget; 3 takes 4 chunks off the fullest (ties:
     * the most recent) 2,1,0,2; 4 takes 3,1,0,3 -> levels 2,2,2,2,4: every
     * block keeps its first two chunks instead of three whole frames */
    for (uint32_t b = 0; b < 5; b++)
        use(&r, 0, b, PG);
    uint64_t want[5] = { 8192, 8192, 8192, 8192, PG };
    for (uint32_t b = 0; b < 5; b++)
        cr_assert_eq(jlm_pager_filled(r.p, 0, b), want[b], "block %u holds %llu bytes, expected %llu", b,
                     (unsigned long long)jlm_pager_filled(r.p, 0, b), (unsigned long long)want[b]);
    uint32_t ev[8];
    cr_assert_eq(evictions(&r, 0, ev, 8), 0, "a block was evicted whole");
    /* pass 2 on: each block reads its missing half, one read each (block 4
     * too: block 0's half came off it, the fullest) */
    jlm_pager_stats_reset(r.p);
    uint64_t reads0 = r.fs->n_reads;
    for (uint32_t b = 0; b < 5; b++)
        use(&r, 0, b, PG);
    jlm_pager_counters st;
    jlm_pager_stats(r.p, &st);
    cr_assert_eq(st.a[0].bytes_read, 5 * 8192, "bytes read %llu", (unsigned long long)st.a[0].bytes_read);
    cr_assert_eq(r.fs->n_reads - reads0, 5, "one coalesced read per block");
    cr_assert_eq(st.a[0].fills, 5, "fills %llu", (unsigned long long)st.a[0].fills);
    cr_assert_eq(st.a[0].page_ins + st.a[0].evictions, 0);
    cr_assert_eq(st.a[0].trims, 5, "trims %llu", (unsigned long long)st.a[0].trims);
    rig_close(&r);
}

/* A cyclic scan of n pages of sc chunks at a budget of bc chunks, the
 * engine's way (get l, [prefetch l+1], unpin l). The page computed must be
 * whole (and with prefetch the page being read too: k = 1 or 2 whole pages),
 * so at every step the other pages hold at most bc - k*sc chunks, and
 * summed over a cycle a page's chunks that survive to its next get are at
 * most (bc - k*sc) * n / (n - k): the fewest chunks a cycle can read are
 * n*sc - that = n * (n*sc - bc) / (n - k) (see docs/pager.md, Partial frames).
 * Levelled partial frames reach it exactly over n - k cycles. */
#define CYC_N 8u
#define CYC_SC 16u
#define CYC_PG (CYC_SC * 4096u)
typedef struct cyc { uint8_t *data; jlm_source *mem; jlm_fault_source *fs; jlm_pager *p; } cyc;

static void cyc_open(cyc *c, uint64_t budget, int prefetch)
{
    jlm_err err = { 0 };
    c->data = make_content(BLK_BASE + CYC_N * CYC_PG);
    cr_assert_eq(jlm_source_open_mem(c->data, BLK_BASE + CYC_N * CYC_PG, "cyc.jlm", &c->mem, &err), 0);
    cr_assert_eq(jlm_source_open_fault(c->mem, &c->fs, &err), 0);
    jlm_pager_array_desc d = { .name = "blocks", .cls = JLM_PAGER_BLOCK, .base_off = BLK_BASE,
                               .page_size = CYC_PG, .n_pages = CYC_N };
    jlm_pager_config cfg = { .src = &c->fs->base, .chunk = 4096, .n_arrays = 1, .arrays = &d, .budget = budget };
    cr_assert_eq(jlm_pager_open(&cfg, &c->p, &err), 0, "%s", err.msg);
    jlm_pager_set_prefetch(c->p, prefetch);
}

static void cyc_close(cyc *c)
{
    jlm_pager_close(c->p);
    jlm_source_close(&c->fs->base);
    jlm_source_close(c->mem);
    free(c->data);
}

/* The bytes the pager has read. */
static uint64_t cyc_read(cyc *c)
{
    jlm_pager_counters st;
    jlm_pager_stats(c->p, &st);
    return st.a[0].bytes_read;
}

/* Page l's step ends: unpinned, the invariants checked before and after. */
static void cyc_done(cyc *c, uint32_t l)
{
    jlm_err err = { 0 };
    cr_assert_eq(jlm_pager_check(c->p, &err), 0, "%s", err.msg);
    jlm_pager_unpin(c->p, 0, l);
    cr_assert_eq(jlm_pager_check(c->p, &err), 0, "%s", err.msg);
}

/* One cycle; returns the bytes it read (prefetches counted when collected:
 * the prefetch of block 0 issued by the last step lands in the next cycle). */
static uint64_t cyc_pass(cyc *c, int prefetch, uint32_t pin0)
{
    jlm_err err = { 0 };
    uint64_t before = cyc_read(c);
    for (uint32_t l = pin0; l < CYC_N; l++) {
        const void *ptr = NULL;
        cr_assert_eq(jlm_pager_get(c->p, 0, l, 0, CYC_PG, &ptr, &err), 0, "%s", err.msg);
        if (prefetch)
            jlm_pager_prefetch(c->p, 0, l + 1 < CYC_N ? l + 1 : pin0);
        check_bytes(ptr, BLK_BASE + (uint64_t)l * CYC_PG, CYC_PG, "scanned block");
        cyc_done(c, l);
    }
    return cyc_read(c) - before;
}

static void cyclic_optimum(int prefetch)
{
    uint64_t k = prefetch ? 2 : 1, n = CYC_N, sc = CYC_SC;
    /* budgets in chunks between whole-frame multiples (and on a few), one
     * with a remainder below a chunk (ignored: no chunk fits it) */
    uint64_t bcs[] = { 2 * sc + 1, 2 * sc + 7, 3 * sc, 3 * sc + 5, 4 * sc + 9, 5 * sc + 15, 6 * sc + 3, 7 * sc + 8, 8 * sc - 1 };
    for (size_t i = 0; i < sizeof bcs / sizeof *bcs; i++) {
        uint64_t bc = bcs[i];
        cyc c;
        cyc_open(&c, bc * 4096 + (i == 3 ? 4000 : 0), prefetch);
        for (int w = 0; w < 3 * (int)n; w++)   /* warm up: the levels settle */
            cyc_pass(&c, prefetch, 0);
        uint64_t total = 0, lo = UINT64_MAX, hi = 0;
        for (uint64_t cyc_i = 0; cyc_i < n - k; cyc_i++) {
            uint64_t b = cyc_pass(&c, prefetch, 0);
            total += b;
            lo = b < lo ? b : lo;
            hi = b > hi ? b : hi;
        }
        uint64_t want = n * (n * sc - bc) * 4096;   /* over n - k cycles */
        cr_assert_eq(total, want, "prefetch %d, budget %llu chunks: %llu bytes in %llu cycles, optimum %llu", prefetch,
                     (unsigned long long)bc, (unsigned long long)total, (unsigned long long)(n - k),
                     (unsigned long long)want);
        cr_assert(hi - lo <= k * 4096, "budget %llu chunks: cycles read %llu..%llu bytes (levels one chunk apart)",
                  (unsigned long long)bc, (unsigned long long)lo, (unsigned long long)hi);
        /* whole frames (before partial frames): f = bc / sc frames, so at best
         * n * (n - f) * sc over n - k cycles with prefetch off (the MRU
         * figure); partial frames read less unless the budget is whole frames */
        uint64_t f = bc / sc, whole = n * (n - f) * sc * 4096;
        if (!prefetch)
            cr_assert(bc % sc ? total < whole : total == whole, "budget %llu chunks: %llu bytes, whole frames %llu",
                      (unsigned long long)bc, (unsigned long long)total, (unsigned long long)whole);
        jlm_pager_counters st;
        jlm_pager_stats(c.p, &st);
        cr_assert(st.peak_bytes <= bc * 4096, "peak %llu past the budget", (unsigned long long)st.peak_bytes);
        if (prefetch)
            cr_assert(st.a[0].pf_skipped == 0 && st.a[0].pf_misses == 1, "budget %llu chunks: %llu skipped, %llu misses",
                      (unsigned long long)bc, (unsigned long long)st.a[0].pf_skipped,
                      (unsigned long long)st.a[0].pf_misses);
        cyc_close(&c);
    }
}

Test(pager, a_cyclic_scan_reads_the_optimum_at_budgets_between_whole_frames, .timeout = 30)
{
    cyclic_optimum(0);
}

Test(pager, a_cyclic_scan_with_prefetch_reads_the_optimum_for_two_whole_pages, .timeout = 30)
{
    cyclic_optimum(1);
}

/* The engine's tensor-granular way (engine/stream.c, op by op): page l
 * pinned by a get of its first op's bytes, then advanced op by op
 * (jlm_pager_advance: what is before the op released), each op's bytes
 * checked, optionally the next op read ahead (prefetch_range: in the same
 * page, or the next page's first). Returns the bytes a cycle read. */
#define CYC_OPS 4u
#define CYC_OP (CYC_PG / CYC_OPS)
static uint64_t cyc_pass_ops(cyc *c, int prefetch)
{
    jlm_err err = { 0 };
    uint64_t before = cyc_read(c);
    for (uint32_t l = 0; l < CYC_N; l++) {
        const void *ptr = NULL;
        cr_assert_eq(jlm_pager_get(c->p, 0, l, 0, CYC_OP, &ptr, &err), 0, "%s", err.msg);
        for (uint32_t k = 0; k < CYC_OPS; k++) {
            cr_assert_eq(jlm_pager_advance(c->p, 0, l, k * CYC_OP, CYC_OP, &err), 0, "%s", err.msg);
            if (prefetch)
                jlm_pager_prefetch_range(c->p, 0, k + 1 < CYC_OPS ? l : (l + 1) % CYC_N, (k + 1) % CYC_OPS * CYC_OP,
                                         CYC_OP);
            check_bytes((const uint8_t *)ptr + k * CYC_OP, BLK_BASE + (uint64_t)l * CYC_PG + k * CYC_OP, CYC_OP,
                        "op's bytes");
            cr_assert_eq(jlm_pager_check(c->p, &err), 0, "%s", err.msg);
        }
        cyc_done(c, l);
    }
    return cyc_read(c) - before;
}

/* Released op by op, a cyclic scan holds beyond the levels only the op in
 * use (and the one read ahead), not the whole page: a cycle reads blocks -
 * budget plus about that window (w chunks, + 1 for the levels' step), well
 * under the whole-page optimum (n*sc - bc) * n / (n - k). With a whole
 * page pinned while it computes (release at page granularity) this fails. */
static void cyclic_ops(int prefetch)
{
    uint64_t k = prefetch ? 2 : 1, n = CYC_N, sc = CYC_SC, w = (prefetch ? 2 : 1) * (CYC_OP / 4096);
    uint64_t bcs[] = { 2 * sc + 1, 3 * sc + 5, 5 * sc + 3 };
    for (size_t i = 0; i < sizeof bcs / sizeof *bcs; i++) {
        uint64_t bc = bcs[i];
        cyc c;
        cyc_open(&c, bc * 4096, prefetch);
        for (int r = 0; r < 3 * (int)n; r++)
            cyc_pass_ops(&c, prefetch);
        uint64_t total = 0, cycles = n;
        for (uint64_t r = 0; r < cycles; r++)
            total += cyc_pass_ops(&c, prefetch);
        uint64_t bound = cycles * (n * sc - bc + w + 1) * 4096, whole = cycles * (n * sc - bc) * n / (n - k) * 4096;
        cr_assert(total <= bound && total < whole,
                  "prefetch %d, budget %llu chunks: %llu bytes in %llu cycles; blocks - budget + the op window: %llu, "
                  "whole pages: %llu", prefetch, (unsigned long long)bc, (unsigned long long)total,
                  (unsigned long long)cycles, (unsigned long long)bound, (unsigned long long)whole);
        jlm_pager_counters st;
        jlm_pager_stats(c.p, &st);
        cr_assert(st.peak_bytes <= bc * 4096, "peak %llu past the budget", (unsigned long long)st.peak_bytes);
        if (prefetch)
            cr_assert(st.a[0].pf_issued > 0 && st.a[0].pf_hits + st.a[0].pf_waits > 0, "the ops read ahead were used");
        cyc_close(&c);
    }
}

Test(pager, a_scan_advanced_op_by_op_reads_blocks_minus_budget_plus_one_op, .timeout = 30)
{
    cyclic_ops(0);
}

Test(pager, a_scan_advanced_op_by_op_with_the_next_op_read_ahead_reads_blocks_minus_budget_plus_two, .timeout = 30)
{
    cyclic_ops(1);
}

/* A second get of a page being advanced through cancels its release: the
 * released chunks stay while the second holder has the page. */
Test(pager, a_second_get_keeps_the_chunks_an_advance_released, .timeout = 10)
{
    cyc c;
    cyc_open(&c, (CYC_SC + 2 * CYC_OPS) * 4096, 0);
    jlm_err err = { 0 };
    const void *p0 = NULL, *p1 = NULL;
    cr_assert_eq(jlm_pager_get(c.p, 0, 0, 0, CYC_OP, &p0, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_pager_advance(c.p, 0, 0, 3 * CYC_OP, CYC_OP, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_pager_get(c.p, 0, 0, 0, CYC_OP, &p1, &err), 0, "%s", err.msg);
    for (uint32_t l = 1; l < 3; l++) {   /* pages that need the room */
        const void *q = NULL;
        cr_assert_eq(jlm_pager_get(c.p, 0, l, 0, CYC_PG - 4096 * (l == 2), &q, &err), 0, "%s", err.msg);
        jlm_pager_unpin(c.p, 0, l);
    }
    check_bytes(p1, BLK_BASE, CYC_OP, "the second holder's bytes");
    cr_assert_eq(jlm_pager_advance(c.p, 0, 5, 0, 4096, &err), JLM_EINVAL, "an unpinned page cannot be advanced");
    jlm_pager_unpin(c.p, 0, 0);
    jlm_pager_unpin(c.p, 0, 0);
    cr_assert_eq(jlm_pager_check(c.p, &err), 0, "%s", err.msg);
    cyc_close(&c);
}

/* The chunks a scan evicts move (mremap) into the page that reads next at the
 * same offsets: a steady cycle maps no fresh memory, so it takes no page
 * fault per page read (with MADV_DONTNEED and fresh pages it took one per
 * 4096 bytes read). */
Test(pager, evicted_chunks_move_to_the_page_read_next_without_page_faults, .timeout = 20)
{
    cyc c;
    cyc_open(&c, (4 * CYC_SC + 9) * 4096, 0);
    for (int w = 0; w < 3 * (int)CYC_N; w++)
        cyc_pass(&c, 0, 0);
    struct rusage r0, r1;
    getrusage(RUSAGE_THREAD, &r0);
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < CYC_N - 1; i++)
        bytes += cyc_pass(&c, 0, 0);
    getrusage(RUSAGE_THREAD, &r1);
    uint64_t faults = (uint64_t)(r1.ru_minflt - r0.ru_minflt), pages = bytes / 4096;
    cr_assert(faults * 4 < pages, "%llu page faults reading %llu pages", (unsigned long long)faults,
              (unsigned long long)pages);
    cyc_close(&c);
}

Test(pager, a_pinned_block_keeps_every_chunk_while_a_scan_trims_the_others, .timeout = 20)
{
    cyc c;
    cyc_open(&c, (3 * CYC_SC + 5) * 4096, 0);
    jlm_err err = { 0 };
    const void *p0 = NULL;
    cr_assert_eq(jlm_pager_get(c.p, 0, 0, 0, CYC_PG, &p0, &err), 0, "%s", err.msg);
    for (int pass = 0; pass < 10; pass++) {
        cyc_pass(&c, 0, 1);
        cr_assert_eq(jlm_pager_filled(c.p, 0, 0), CYC_PG, "the pinned block lost chunks");
    }
    check_bytes(p0, BLK_BASE, CYC_PG, "pinned block after the scans");
    /* the others level off in the budget the pinned block leaves: 2 frames + 5 chunks
     * among 7 pages, the page computed whole: n-1 = 7 scanned, optimum over 6 cycles */
    uint64_t total = 0;
    for (int i = 0; i < 6; i++)
        total += cyc_pass(&c, 0, 1);
    uint64_t n = CYC_N - 1, bc = 2 * CYC_SC + 5;
    cr_assert_eq(total, n * (n * CYC_SC - bc) * 4096, "%llu bytes", (unsigned long long)total);
    jlm_pager_unpin(c.p, 0, 0);
    cr_assert_eq(jlm_pager_check(c.p, &err), 0, "%s", err.msg);
    cyc_close(&c);
}

Test(pager, experts_go_whole_and_least_recent_first_before_a_block_loses_a_chunk, .timeout = 10)
{
    rig r;
    rig_open(&r, 2, 2, NULL);
    use(&r, 0, 0, PG);
    use(&r, 0, 1, PG);
    use(&r, 1, 0, XPG);
    use(&r, 1, 1, XPG);                                      /* budget full */
    use(&r, 1, 2, XPG);                                      /* LRU expert 0 goes, whole */
    use(&r, 0, 2, PG);                                       /* expert 1, then expert 2 whole, then block chunks */
    jlm_pager_counters st;
    jlm_pager_stats(r.p, &st);
    uint32_t ev[8];
    int n = evictions(&r, 1, ev, 8);
    cr_assert_eq(n, 3, "expert evictions %d", n);
    cr_assert(ev[0] == 0 && ev[1] == 1 && ev[2] == 2, "experts evicted %u %u %u, expected 0 1 2", ev[0], ev[1], ev[2]);
    for (int i = 0; i < r.n_ev; i++)
        cr_assert(r.ev[i].kind != JLM_PAGER_EV_EVICT || r.ev[i].array != 1 || r.ev[i].bytes == XPG);
    cr_assert_eq(st.a[1].trims, 0, "an expert was trimmed");
    cr_assert_eq(st.a[0].trims, 0, "a block lost chunks while experts could go");
    cr_assert_eq(st.resident_bytes, 3 * PG, "resident %llu", (unsigned long long)st.resident_bytes);
    rig_close(&r);
}

/* Invariant (8), checked by jlm_pager_check after every operation above: the
 * memory of chunks evicted from a page that stays resident is given back. */
Test(pager, a_trimmed_frame_gives_the_memory_of_its_evicted_chunks_back, .timeout = 10)
{
    rig r;
    rig_open(&r, 2, 0, NULL);
    use(&r, 0, 0, PG);
    use(&r, 0, 1, PG);
    use(&r, 0, 2, PG);
    cr_assert(jlm_pager_resident(r.p, 0, 1) && jlm_pager_filled(r.p, 0, 1) < PG, "block 1 was not trimmed");
    jlm_pager_counters st;
    jlm_pager_stats(r.p, &st);
    cr_assert_eq(st.resident_bytes, 2 * PG);
    cr_assert_gt(st.a[0].trims, 0);
    check(&r);   /* mincore: no page of an evicted chunk is mapped */
    rig_close(&r);
}

Test(pager, partial_fill_reads_only_missing_chunks_and_coalesces_runs, .timeout = 10)
{
    rig r;
    rig_open(&r, 0, 0, NULL);
    get_ok(&r, 0, 2, 4096 + 10, 100);                        /* chunk 1 only */
    jlm_pager_unpin(r.p, 0, 2);
    cr_assert_eq(r.fs->n_reads, 1);
    cr_assert_eq(r.fs->log[0].off, page_off(0, 2) + 4096, "read at %llu", (unsigned long long)r.fs->log[0].off);
    cr_assert_eq(r.fs->log[0].len, 4096);
    cr_assert_eq(jlm_pager_filled(r.p, 0, 2), 4096);
    get_ok(&r, 0, 2, 0, PG);                                 /* chunk 0, then chunks 2-3 as one read */
    jlm_pager_unpin(r.p, 0, 2);
    cr_assert_eq(r.fs->n_reads, 3, "reads %llu, expected 3", (unsigned long long)r.fs->n_reads);
    cr_assert_eq(r.fs->log[1].off, page_off(0, 2));
    cr_assert_eq(r.fs->log[1].len, 4096);
    cr_assert_eq(r.fs->log[2].off, page_off(0, 2) + 8192);
    cr_assert_eq(r.fs->log[2].len, 8192, "coalesced run of %zu bytes, expected 8192", r.fs->log[2].len);
    cr_assert_eq(r.fs->bytes_read, PG, "bytes read %llu, expected one page", (unsigned long long)r.fs->bytes_read);
    get_ok(&r, 0, 2, 5000, 9000);
    jlm_pager_unpin(r.p, 0, 2);
    cr_assert_eq(r.fs->n_reads, 3, "a fully filled page was read again");
    jlm_pager_counters st;
    jlm_pager_stats(r.p, &st);
    cr_assert_eq(st.a[0].page_ins, 1);
    cr_assert_eq(st.a[0].fills, 1);
    cr_assert_eq(st.a[0].hits, 1);
    cr_assert_eq(st.a[0].bytes_read, PG);
    rig_close(&r);
}

Test(pager, unlimited_budget_reads_each_page_once_then_only_hits, .timeout = 10)
{
    rig r;
    rig_open(&r, 0, 0, NULL);
    for (int tok = 0; tok < 3; tok++) {
        for (uint32_t b = 0; b < NB; b++)
            use(&r, 0, b, PG);
        for (uint32_t x = 0; x < NX; x += 2)
            use(&r, 1, x, XPG);
    }
    jlm_pager_counters st;
    jlm_pager_stats(r.p, &st);
    cr_assert_eq(r.fs->bytes_read, NB * PG + (NX / 2) * XPG, "bytes read %llu",
                 (unsigned long long)r.fs->bytes_read);
    cr_assert_eq(st.a[0].page_ins, NB);
    cr_assert_eq(st.a[0].hits, 2 * NB);
    cr_assert_eq(st.a[1].hits, 2 * (NX / 2));
    cr_assert_eq(st.a[0].evictions + st.a[1].evictions, 0);
    cr_assert_eq(st.resident_bytes, NB * PG + (NX / 2) * XPG);
    rig_close(&r);
}

Test(pager, a_one_frame_budget_pages_every_block_in_with_the_right_bytes, .timeout = 10)
{
    rig r;
    rig_open(&r, 0, 0, NULL);
    uint32_t pinned[2] = { 1, 0 };
    uint64_t min = jlm_pager_min_budget(r.p, pinned);
    cr_assert_eq(min, PG, "min budget %llu, expected one block frame", (unsigned long long)min);
    jlm_err err = { 0 };
    cr_assert_eq(jlm_pager_set_budget(r.p, min, &err), 0, "%s", err.msg);
    for (int tok = 0; tok < 3; tok++)
        for (uint32_t b = 0; b < NB; b++)
            use(&r, 0, b, PG);                                /* use() compares every byte */
    jlm_pager_counters st;
    jlm_pager_stats(r.p, &st);
    cr_assert_eq(st.a[0].page_ins, 3 * NB);
    cr_assert_eq(st.a[0].evictions, 3 * NB - 1);
    cr_assert_eq(st.peak_bytes, PG, "peak %llu bytes, budget %u", (unsigned long long)st.peak_bytes, PG);
    cr_assert_eq(r.fs->bytes_read, 3ull * NB * PG);
    rig_close(&r);
}

Test(pager, a_failed_read_names_the_file_and_offset_and_leaves_the_pager_consistent, .timeout = 10)
{
    rig r;
    rig_open(&r, 2, 0, NULL);
    use(&r, 0, 0, PG);
    r.fs->fail_nth = 2;                                      /* the next read */
    jlm_err err = { 0 };
    const void *ptr = NULL;
    int rc = jlm_pager_get(r.p, 0, 1, 0, PG, &ptr, &err);
    cr_assert_eq(rc, JLM_EIO, "rc %d, expected JLM_EIO", rc);
    char off[32];
    snprintf(off, sizeof off, "%llu", (unsigned long long)page_off(0, 1));
    cr_assert(strstr(err.msg, "mem.jlm") && strstr(err.msg, off) && strstr(err.msg, "blocks page 1"),
              "message should name the file, offset %s and page: %s", off, err.msg);
    cr_assert_null(ptr);
    check(&r);
    cr_assert(!jlm_pager_resident(r.p, 0, 1), "a page with nothing read stayed resident");
    /* a failure in the middle of a partial fill keeps the chunks read before it */
    get_ok(&r, 0, 1, 0, 4096);
    jlm_pager_unpin(r.p, 0, 1);
    r.fs->fail_nth = r.fs->n_reads + 2;                      /* chunk 1 reads, chunks 3.. fail */
    get_ok(&r, 0, 1, 4096, 4096);
    jlm_pager_unpin(r.p, 0, 1);
    rc = jlm_pager_get(r.p, 0, 1, 0, PG, &ptr, &err);
    cr_assert_eq(rc, JLM_EIO);
    check(&r);
    cr_assert_eq(jlm_pager_filled(r.p, 0, 1), 8192, "filled %llu after a failed fill, expected 8192",
                 (unsigned long long)jlm_pager_filled(r.p, 0, 1));
    get_ok(&r, 0, 1, 0, PG);                                 /* the source recovered */
    jlm_pager_unpin(r.p, 0, 1);
    check(&r);
    rig_close(&r);
}

Test(pager, reads_a_page_only_up_to_its_extent_and_refuses_ranges_past_it, .timeout = 10)
{
    uint64_t ext[NB] = { PG, 8192, PG, 4096, PG, PG };
    rig r;
    rig_open(&r, 0, 0, ext);
    use(&r, 0, 1, 8192);
    cr_assert_eq(r.fs->bytes_read, 8192);
    jlm_err err = { 0 };
    const void *ptr = NULL;
    int rc = jlm_pager_get(r.p, 0, 3, 0, 4097, &ptr, &err);
    cr_assert_eq(rc, JLM_EINVAL, "rc %d for a range past the extent", rc);
    cr_assert(strstr(err.msg, "extent 4096"), "%s", err.msg);
    rc = jlm_pager_get(r.p, 0, NB, 0, 1, &ptr, &err);
    cr_assert_eq(rc, JLM_EINVAL, "rc %d for a page out of range", rc);
    check(&r);
    rig_close(&r);
}

Test(pager, refuses_configurations_it_cannot_page, .timeout = 10)
{
    uint8_t *data = make_content(SRC_LEN);
    jlm_source *s;
    jlm_err err = { 0 };
    cr_assert_eq(jlm_source_open_mem(data, SRC_LEN, "m", &s, &err), 0);
    jlm_pager_array_desc d = { .name = "blocks", .cls = JLM_PAGER_BLOCK, .base_off = BLK_BASE,
                               .page_size = PG, .n_pages = NB };
    jlm_pager_config cfg = { .src = s, .chunk = 4096, .n_arrays = 1, .arrays = &d };
    jlm_pager *p = NULL;
    cfg.chunk = 6144;
    cr_assert_eq(jlm_pager_open(&cfg, &p, &err), JLM_EINVAL, "chunk 6144 accepted");
    cr_assert(strstr(err.msg, "chunk 6144"), "%s", err.msg);
    cfg.chunk = 4096;
    d.page_size = 5000;
    cr_assert_eq(jlm_pager_open(&cfg, &p, &err), JLM_EINVAL, "page size 5000 accepted");
    d.page_size = PG;
    d.n_pages = 100;
    cr_assert_eq(jlm_pager_open(&cfg, &p, &err), JLM_EINVAL, "an array past the source's end accepted");
    cr_assert(strstr(err.msg, "end past m"), "%s", err.msg);
    d.n_pages = NB;
    uint64_t ext[NB] = { PG, PG, 100, PG, PG, PG };
    d.extent = ext;
    cr_assert_eq(jlm_pager_open(&cfg, &p, &err), JLM_EINVAL, "extent 100 accepted");
    cr_assert_null(p);
    jlm_source_close(s);
    free(data);
}

Test(pager, lowering_the_budget_evicts_unpinned_pages_and_refuses_below_the_pinned_ones, .timeout = 10)
{
    rig r;
    rig_open(&r, 0, 0, NULL);
    for (uint32_t b = 0; b < 4; b++)
        use(&r, 0, b, PG);
    use(&r, 1, 0, XPG);
    get_ok(&r, 0, 0, 0, PG);                                 /* pinned */
    jlm_err err = { 0 };
    cr_assert_eq(jlm_pager_set_budget(r.p, PG - 4096, &err), JLM_ERANGE, "budget below a pinned frame accepted");
    cr_assert_eq(jlm_pager_set_budget(r.p, 2 * PG, &err), 0, "%s", err.msg);
    check(&r);
    cr_assert(!jlm_pager_resident(r.p, 1, 0), "the expert should go first");
    cr_assert(jlm_pager_resident(r.p, 0, 0), "the pinned block was evicted");
    jlm_pager_counters st;
    jlm_pager_stats(r.p, &st);
    cr_assert_eq(st.resident_bytes, 2 * PG);
    jlm_pager_unpin(r.p, 0, 0);
    check(&r);
    rig_close(&r);
}

Test(pager, reports_page_ins_hits_and_evictions_to_the_event_hook, .timeout = 10)
{
    rig r;
    rig_open(&r, 1, 0, NULL);
    use(&r, 0, 0, PG);
    use(&r, 0, 0, PG);
    use(&r, 0, 1, PG);
    int kinds[4] = { JLM_PAGER_EV_PAGE_IN, JLM_PAGER_EV_HIT, JLM_PAGER_EV_EVICT, JLM_PAGER_EV_PAGE_IN };
    uint32_t pages[4] = { 0, 0, 0, 1 };
    cr_assert_eq(r.n_ev, 4, "%d events, expected 4", r.n_ev);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(r.ev[i].kind, kinds[i], "event %d kind %d, expected %d", i, r.ev[i].kind, kinds[i]);
        cr_assert_eq(r.ev[i].page, pages[i], "event %d page %u", i, r.ev[i].page);
        cr_assert_str_eq(r.ev[i].array_name, "blocks");
    }
    cr_assert_eq(r.ev[0].bytes, PG);
    cr_assert_eq(r.ev[0].tier, JLM_TIER_MEMORY);
    cr_assert_eq(r.ev[1].tier, JLM_TIER_FRAME);
    rig_close(&r);
}

Test(pager, random_gets_and_unpins_keep_every_invariant_and_every_byte, .timeout = 20)
{
    rig r;
    rig_open(&r, 2, 2, NULL);                                /* room for 3 pins of any array */
    uint64_t x = 12345;
    uint32_t pins[8][2];
    int n_pins = 0;
    for (int op = 0; op < 4000; op++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t rnd = (uint32_t)(x >> 33);
        if (n_pins == 3 || (n_pins > 0 && rnd % 3 == 0)) {
            int k = (int)(rnd / 3 % (uint32_t)n_pins);
            jlm_pager_unpin(r.p, pins[k][0], pins[k][1]);
            pins[k][0] = pins[n_pins - 1][0];
            pins[k][1] = pins[n_pins - 1][1];
            n_pins--;
            check(&r);
            continue;
        }
        uint32_t a = rnd >> 4 & 1, pg = (rnd >> 5) % (a ? NX : NB), psz = a ? XPG : PG;
        uint64_t off = (rnd >> 9) % psz, len = (rnd >> 3) % (psz - off + 1);
        get_ok(&r, a, pg, off, len);                         /* compares the bytes, checks */
        pins[n_pins][0] = a;
        pins[n_pins][1] = pg;
        n_pins++;
    }
    while (n_pins > 0) {
        n_pins--;
        jlm_pager_unpin(r.p, pins[n_pins][0], pins[n_pins][1]);
    }
    check(&r);
    jlm_pager_counters st;
    jlm_pager_stats(r.p, &st);
    cr_assert_gt(st.a[0].evictions + st.a[1].evictions, 0, "the budget never forced an eviction");
    cr_assert_gt(st.a[0].fills + st.a[1].fills, 0, "no partial fill happened");
    rig_close(&r);
}

/* ---------------------------------------------------------------- huge pages */
/* 1 if the 4096-byte page holding addr is mapped (mincore), 0 if not, -1 unknown. */
static int page_mapped(const void *addr)
{
    unsigned char v = 0;
    void *pg = (void *)((uintptr_t)addr & ~(uintptr_t)4095);
    return mincore(pg, 4096, &v) == 0 ? (v & 1) : -1;
}

/* The THPeligible line of /proc/self/smaps for the mapping holding addr:
 * 1 or 0, -1 if not found. It follows the mapping's flags (MADV_HUGEPAGE,
 * alignment), not whether the kernel found a free huge page, so it is a
 * deterministic check. */
static int thp_eligible(const void *addr)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[512];
    int in = 0, v = -1;
    uintptr_t a = (uintptr_t)addr;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = a >= lo && a < hi;
            continue;
        }
        if (in && sscanf(line, "THPeligible: %d", &v) == 1)
            break;
    }
    fclose(f);
    return in ? v : -1;
}

/* With chunks of the transparent huge page size (what the engine gives its
 * pager where THP is on: jlm_pager_chunk_for), frames start on a huge page
 * boundary and are huge-page eligible up to the page's extent at a budget that
 * trims and moves chunks; the tail past the extent rounded down is not (no
 * huge page may map memory past what the page holds); every byte is right
 * and every invariant (mincore included) holds after every step of cyclic
 * scans with and without prefetch. */
Test(pager, huge_page_chunks_keep_frames_aligned_and_every_invariant_under_a_budget, .timeout = 60)
{
    uint64_t H = jlm_pager_thp_size();
    if (!H)
        cr_skip_test("transparent huge pages are off here");
    cr_assert_eq(jlm_pager_chunk_for(65536), H > 65536 ? H : 65536);
    cr_assert_eq(jlm_pager_chunk_for(2 * H), 2 * H);
    enum { N = 4 };
    uint64_t psz = 3 * H + 8192, base = 4096, len = base + N * psz;
    uint64_t ext[N] = { psz, psz, psz, 2 * H };   /* page 3 ends on a huge page */
    uint8_t *data = make_content((size_t)len);
    jlm_source *mem;
    jlm_pager *p;
    jlm_err err = { 0 };
    cr_assert_eq(jlm_source_open_mem(data, (size_t)len, "huge.jlm", &mem, &err), 0, "%s", err.msg);
    jlm_pager_array_desc d = { .name = "blocks", .cls = JLM_PAGER_BLOCK, .base_off = base, .page_size = psz,
                               .n_pages = N, .extent = ext };
    jlm_pager_config cfg = { .src = mem, .chunk = H, .budget = 2 * psz + H, .n_arrays = 1, .arrays = &d };
    cr_assert_eq(jlm_pager_open(&cfg, &p, &err), 0, "%s", err.msg);
    for (int pf = 0; pf < 2; pf++) {
        jlm_pager_set_prefetch(p, pf);
        for (int pass = 0; pass < 4; pass++)
            for (uint32_t l = 0; l < N; l++) {
                const void *ptr = NULL;
                cr_assert_eq(jlm_pager_get(p, 0, l, 0, ext[l], &ptr, &err), 0, "%s", err.msg);
                cr_assert_eq((uintptr_t)ptr % H, 0, "page %u's frame at %p, not on a %llu-byte boundary", l, ptr,
                             (unsigned long long)H);
                cr_assert_eq(thp_eligible(ptr), 1, "page %u: its frame is not huge-page eligible", l);
                if (ext[l] % H)   /* the 8 KiB past the last huge page */
                    cr_assert_eq(thp_eligible((const uint8_t *)ptr + ext[l] / H * H), 0,
                                 "page %u: the tail past its extent is huge-page eligible", l);
                check_bytes(ptr, base + l * psz, (size_t)ext[l], "huge-page frame");
                if (pf)
                    jlm_pager_prefetch(p, 0, (l + 1) % N);
                cr_assert_eq(jlm_pager_check(p, &err), 0, "invariant broken: %s", err.msg);
                jlm_pager_unpin(p, 0, l);
                cr_assert_eq(jlm_pager_check(p, &err), 0, "invariant broken: %s", err.msg);
            }
    }
    jlm_pager_counters c;
    jlm_pager_stats(p, &c);
    cr_assert_gt(c.a[0].trims, 0, "the budget never trimmed a page in part");
    cr_assert_gt(c.a[0].pf_issued, 0, "no prefetch was issued");
    jlm_pager_close(p);
    jlm_source_close(mem);
    free(data);
}

/* Huge frames. Unlimited, a page whose last huge page would be at least 3/4
 * full maps its frame in huge pages whole, its tail included; of those, the
 * pages of one chunk (pages 0, 1, 2) are one huge frames, charged their huge
 * page, and stay so under a budget down to 3/8 of the pages as one huge frames
 * (page 2, near full, below it too);
 * page 4 (two chunks) is whole only while the budget holds everything (its
 * tail uncharged) and gives its tail back when it no longer does. Below 3/8,
 * a page taking a one huge frame over gets exact small pages, charged its
 * extent, the memory past it given back (the check's invariant 8). The test
 * writes the tails itself (what the kernel's huge page does, whether or not
 * it found a free one here), so the checks fail without the exception and
 * without the releases. */
Test(pager, frames_are_whole_huge_pages_while_the_budget_holds_everything, .timeout = 60)
{
    uint64_t H = jlm_pager_thp_size();
    if (!H)
        cr_skip_test("transparent huge pages are off here");
    enum { N = 5 };
    uint64_t psz = 2 * H, base = 4096, len = base + N * psz;
    /* page 2 leaves 1/64 of its huge page (near full); page 3's would be 1/8
     * full; page 4 is two chunks */
    uint64_t ext[N] = { H - H / 16, H - H / 4, H - H / 64, H / 8, 2 * H - 65536 };
    uint8_t *data = make_content((size_t)len);
    jlm_source *mem;
    jlm_pager *p;
    jlm_err err = { 0 };
    cr_assert_eq(jlm_source_open_mem(data, (size_t)len, "whole.jlm", &mem, &err), 0, "%s", err.msg);
    jlm_pager_array_desc d = { .name = "experts", .cls = JLM_PAGER_EXPERT, .base_off = base, .page_size = psz,
                               .n_pages = N, .extent = ext };
    jlm_pager_config cfg = { .src = mem, .chunk = H, .budget = 0, .n_arrays = 1, .arrays = &d };
    cr_assert_eq(jlm_pager_open(&cfg, &p, &err), 0, "%s", err.msg);
    uint8_t *f[N];
    for (uint32_t i = 0; i < N; i++) {
        const void *ptr = NULL;
        cr_assert_eq(jlm_pager_get(p, 0, i, 0, ext[i], &ptr, &err), 0, "%s", err.msg);
        f[i] = (uint8_t *)ptr;
        cr_assert_eq((uintptr_t)ptr % H, 0, "page %u's frame is not on a huge page boundary", i);
        check_bytes(ptr, base + i * psz, (size_t)ext[i], "whole huge frame");
        cr_assert_eq(thp_eligible(ptr), i != 3, "page %u: its frame's eligibility", i);
        if (i == 3) {   /* a huge page for it would map 8 times its bytes: small pages */
            cr_assert_eq(thp_eligible(f[i] + ext[i]), 0, "page 3: the tail of a small page is huge-page eligible");
        } else if (ext[i] % H) {
            uint64_t end = (ext[i] + H - 1) / H * H;
            cr_assert_eq(thp_eligible(f[i] + ext[i]), 1, "page %u: the tail past its extent is not eligible", i);
            memset(f[i] + ext[i], 0x5a, (size_t)(end - ext[i]));   /* as a huge page maps it */
        }
        cr_assert_eq(jlm_pager_check(p, &err), 0, "unlimited, page %u: %s", i, err.msg);
        jlm_pager_unpin(p, 0, i);
    }
    jlm_pager_counters c;
    jlm_pager_stats(p, &c);
    cr_assert_eq(c.resident_bytes, 3 * H + ext[3] + ext[4], "unlimited: %llu bytes charged (one huge frames: H)",
                 (unsigned long long)c.resident_bytes);
    for (uint32_t i = 0; i < N; i++)
        cr_assert_eq(jlm_pager_charge(p, 0, i), i < 3 ? H : ext[i], "unlimited: page %u's charge", i);
    /* a budget below every page + slack, but above what is resident: nothing evicted */
    uint64_t all = ext[0] + ext[1] + ext[2] + ext[3] + ext[4];
    cr_assert_eq(jlm_pager_set_budget(p, all + H, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_pager_check(p, &err), 0, "after the budget went below everything: %s", err.msg);
    for (uint32_t i = 0; i <= N; i++) {   /* page 0 twice: the most recent */
        const void *ptr = NULL;
        uint32_t k = i % N;
        cr_assert_eq(jlm_pager_get(p, 0, k, 0, ext[k], &ptr, &err), 0, "%s", err.msg);
        cr_assert_eq(ptr, f[k], "page %u was evicted", k);
        check_bytes(ptr, base + k * psz, (size_t)ext[k], "frame after the budget fell");
        if (ext[k] % H)
            cr_assert_eq(thp_eligible(f[k] + ext[k]), k < 3, "page %u: its tail's eligibility", k);
        if (k < 3)   /* a one huge frame keeps the tail it is charged for */
            cr_assert_eq(page_mapped(f[k] + ext[k]), 1, "page %u: its tail was given back", k);
        jlm_pager_unpin(p, 0, k);
    }
    /* below 3/8: pages 1-4 evicted, page 0 a one huge frame still (charged H) */
    cr_assert_eq(jlm_pager_set_budget(p, H + H / 2, &err), 0, "%s", err.msg);
    jlm_pager_stats(p, &c);
    cr_assert_eq(c.resident_bytes, H, "below 3/8: %llu bytes charged, expected page 0's huge page",
                 (unsigned long long)c.resident_bytes);
    const void *ptr = NULL;
    cr_assert_eq(jlm_pager_get(p, 0, 1, 0, ext[1], &ptr, &err), 0, "%s", err.msg);
    cr_assert_eq(ptr, f[0], "page 1 did not take page 0's frame over");
    cr_assert_eq(jlm_pager_charge(p, 0, 0), ext[0], "below 3/8, absent page 0 would be charged a huge page");
    cr_assert_eq(jlm_pager_charge(p, 0, 2), H, "below 3/8, absent page 2 (near full) would be charged its huge page");
    check_bytes(ptr, base + psz, (size_t)ext[1], "a one huge frame taken over below 3/8");
    cr_assert_eq(thp_eligible((const uint8_t *)ptr + ext[1]), 0, "page 1: its tail is still huge-page eligible");
    jlm_pager_stats(p, &c);
    cr_assert_eq(c.resident_bytes, ext[1], "page 1 charged %llu bytes, its extent is %llu",
                 (unsigned long long)c.resident_bytes, (unsigned long long)ext[1]);
    cr_assert_eq(jlm_pager_check(p, &err), 0, "after the take-over: %s", err.msg);
    jlm_pager_unpin(p, 0, 1);
    jlm_pager_close(p);
    jlm_source_close(mem);
    free(data);
}

/* ---------------------------------------------------------------- prefetch */
/* Prefetch counters add up: every prefetch issued was used by a get (hit or
 * wait), evicted unused, failed, or is still resident unused (at most one:
 * the scans below prefetch one page ahead). */
static void check_pf_sums(rig *r, uint64_t fresh_max)
{
    jlm_pager_counters c;
    jlm_pager_stats(r->p, &c);
    const jlm_pager_array_counters *b = &c.a[0];
    uint64_t used = b->pf_hits + b->pf_waits + b->pf_unused + b->pf_failed;
    cr_assert(used <= b->pf_issued && b->pf_issued - used <= fresh_max,
              "prefetch: issued %llu, hits %llu, waits %llu, unused %llu, failed %llu",
              (unsigned long long)b->pf_issued, (unsigned long long)b->pf_hits, (unsigned long long)b->pf_waits,
              (unsigned long long)b->pf_unused, (unsigned long long)b->pf_failed);
}

/* passes cyclic scans of the blocks as the engine runs them: get l, prefetch
 * l+1 (0 after the last), use l, unpin. Returns page-ins of the last pass. */
static uint64_t scan_with_prefetch(rig *r, int passes)
{
    jlm_pager_counters c;
    uint64_t before = 0;
    for (int k = 0; k < passes; k++) {
        jlm_pager_stats(r->p, &c);
        before = c.a[0].page_ins;
        for (uint32_t l = 0; l < NB; l++) {
            const uint8_t *pg = get_ok(r, 0, l, 0, PG);
            jlm_pager_prefetch(r->p, 0, (l + 1) % NB);
            check(r);
            check_bytes(pg, page_off(0, l), PG, "block pinned while the next one is read");
            jlm_pager_unpin(r->p, 0, l);
            check(r);
        }
    }
    jlm_pager_stats(r->p, &c);
    return c.a[0].page_ins - before;
}

Test(pager, prefetch_reads_the_next_block_without_evicting_the_one_in_use, .timeout = 10)
{
    for (uint32_t f = 2; f <= NB; f++) {   /* frames: the smallest that prefetches .. all */
        rig r;
        rig_open(&r, f, 0, NULL);
        jlm_pager_set_prefetch(r.p, 1);
        scan_with_prefetch(&r, 4);
        uint64_t two = 0;
        for (int k = 0; k < 2; k++)
            two += scan_with_prefetch(&r, 1);
        /* the page being computed and the page being read take two frames:
         * the steady state alternates between passes and reads at most one
         * page more per two passes than MRU alone (NB - f + 1 a pass); with
         * two frames no page stays (every page read every pass) */
        uint64_t most = f == NB ? 0 : f == 2 ? 2 * NB /* no page stays */ : 2 * (NB - f + 1) + 1;
        cr_assert(two <= most, "%u frames: %llu page-ins in two passes, MRU alone reads %u", f,
                  (unsigned long long)two, 2 * (NB - f + 1));
        for (int i = 0; i < r.n_ev; i++)   /* eviction events name a page absent from then on */
            cr_assert(r.ev[i].kind != JLM_PAGER_EV_EVICT || r.ev[i].bytes == PG);
        jlm_pager_counters c;
        jlm_pager_stats(r.p, &c);
        cr_assert(c.a[0].pf_issued > 0, "%u frames: no prefetch issued", f);
        cr_assert_eq(c.a[0].pf_misses, 1, "%u frames: only the first get reads itself (%llu did)", f,
                     (unsigned long long)c.a[0].pf_misses);
        cr_assert_eq(c.a[0].pf_skipped, 0);
        cr_assert(c.peak_bytes <= (uint64_t)f * PG);
        check_pf_sums(&r, 1);
        jlm_pager_set_prefetch(r.p, 0);   /* collects the read in flight */
        jlm_pager_stats(r.p, &c);
        cr_assert_eq(r.fs->bytes_read, c.a[0].bytes_read, "source bytes %llu, pager counted %llu",
                     (unsigned long long)r.fs->bytes_read, (unsigned long long)c.a[0].bytes_read);
        rig_close(&r);   /* with a prefetch of block 0 possibly in flight */
    }
}

Test(pager, prefetch_is_skipped_when_only_the_page_in_use_fits, .timeout = 10)
{
    rig r;
    rig_open(&r, 1, 0, NULL);
    jlm_pager_set_prefetch(r.p, 1);
    scan_with_prefetch(&r, 2);
    jlm_pager_counters c;
    jlm_pager_stats(r.p, &c);
    cr_assert_eq(c.a[0].pf_issued, 0);
    cr_assert_eq(c.a[0].pf_skipped, 2 * NB, "skipped %llu", (unsigned long long)c.a[0].pf_skipped);
    cr_assert_eq(c.a[0].page_ins, 2 * NB);
    /* off: nothing is read ahead and nothing counted */
    jlm_pager_set_prefetch(r.p, 0);
    jlm_pager_stats_reset(r.p);
    scan_with_prefetch(&r, 1);
    jlm_pager_stats(r.p, &c);
    cr_assert_eq(c.a[0].pf_skipped + c.a[0].pf_issued + c.a[0].pf_misses, 0);
    rig_close(&r);
}

Test(pager, a_failed_prefetch_leaves_the_page_absent_and_the_get_reads_it, .timeout = 10)
{
    rig r;
    rig_open(&r, 3, 0, NULL);
    jlm_pager_set_prefetch(r.p, 1);
    get_ok(&r, 0, 0, 0, PG);
    r.fs->fail_nth = r.fs->n_reads + 1;                       /* the prefetch's read */
    jlm_pager_prefetch(r.p, 0, 1);
    jlm_pager_unpin(r.p, 0, 0);
    get_ok(&r, 0, 1, 0, PG);                                  /* waits, finds it failed, reads */
    jlm_pager_unpin(r.p, 0, 1);
    check(&r);
    jlm_pager_counters c;
    jlm_pager_stats(r.p, &c);
    cr_assert_eq(c.a[0].pf_failed, 1);
    cr_assert_eq(c.a[0].pf_issued, 1);
    cr_assert_eq(c.a[0].page_ins, 2, "page-ins %llu: the failed prefetch is no page-in",
                 (unsigned long long)c.a[0].page_ins);
    cr_assert_eq(r.fs->n_failed, 1);
    /* an unused prefetch evicted by lowering the budget is counted unused */
    jlm_pager_prefetch(r.p, 0, 2);
    cr_assert_eq(jlm_pager_set_budget(r.p, PG, NULL), 0);
    check(&r);
    jlm_pager_stats(r.p, &c);
    cr_assert_eq(c.a[0].pf_unused, 1, "unused %llu", (unsigned long long)c.a[0].pf_unused);
    check_pf_sums(&r, 0);
    rig_close(&r);
}

/* A source whose reads wait while `hold` is set (all but the one at
 * free_off), counting the reads waiting at once: several prefetches in
 * flight are several reads at once. */
typedef struct gate_src {
    jlm_source      base;
    jlm_source     *inner;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int             hold, waiting;
    uint64_t        free_off;
} gate_src;

static int gate_read(jlm_source *s, uint64_t off, size_t len, void *buf, jlm_err *err)
{
    gate_src *g = (gate_src *)s;
    pthread_mutex_lock(&g->mu);
    g->waiting++;
    pthread_cond_broadcast(&g->cv);
    while (g->hold && off != g->free_off)
        pthread_cond_wait(&g->cv, &g->mu);
    g->waiting--;
    pthread_mutex_unlock(&g->mu);
    return g->inner->read(g->inner, off, len, buf, err);
}

static void gate_set(gate_src *g, int hold)
{
    pthread_mutex_lock(&g->mu);
    g->hold = hold;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

Test(pager, prefetches_read_up_to_the_depth_at_once_and_a_get_reads_beside_them, .timeout = 10)
{
    rig r;
    memset(&r, 0, sizeof r);
    jlm_err err = {0};
    r.data = make_content(SRC_LEN);
    cr_assert_eq(jlm_source_open_mem(r.data, SRC_LEN, "mem.jlm", &r.mem, &err), 0, "%s", err.msg);
    gate_src g = {.base = {.read = gate_read, .name = "gate", .size = SRC_LEN}, .inner = r.mem, .hold = 1,
                  .free_off = page_off(1, 5)};
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    jlm_pager_array_desc arrays[2] = {
        { .name = "blocks", .cls = JLM_PAGER_BLOCK, .base_off = BLK_BASE, .page_size = PG, .n_pages = NB },
        { .name = "experts", .cls = JLM_PAGER_EXPERT, .base_off = EXP_BASE, .page_size = XPG, .n_pages = NX },
    };
    jlm_pager_config cfg = { .src = &g.base, .chunk = 4096, .n_arrays = 2, .arrays = arrays };
    cr_assert_eq(jlm_pager_open(&cfg, &r.p, &err), 0, "%s", err.msg);
    jlm_pager_set_prefetch(r.p, 1);
    jlm_pager_set_prefetch_depth(r.p, 4);
    for (uint32_t x = 0; x < 4; x++)
        cr_assert_eq(jlm_pager_prefetch(r.p, 1, x), 1, "expert %u: read started", x);
    cr_assert_eq(jlm_pager_prefetch(r.p, 1, 4), -1, "a fifth read while four are in flight is skipped");
    cr_assert_eq(jlm_pager_prefetch(r.p, 1, 0), 0, "a page on its way: nothing to do");
    pthread_mutex_lock(&g.mu);
    while (g.waiting < 4)   /* the four reads are in the source at once (one reader: the test times out) */
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    check(&r);
    get_ok(&r, 1, 5, 0, XPG);   /* reads beside them, waits for none (else the test times out) */
    jlm_pager_unpin(r.p, 1, 5);
    gate_set(&g, 0);
    for (uint32_t x = 0; x < 4; x++) {
        get_ok(&r, 1, x, 0, XPG);
        jlm_pager_unpin(r.p, 1, x);
    }
    jlm_pager_counters c;
    jlm_pager_stats(r.p, &c);
    cr_assert_eq(c.a[1].pf_issued, 4);
    cr_assert_eq(c.a[1].pf_skipped, 1);
    cr_assert_eq(c.a[1].pf_hits + c.a[1].pf_waits, 4);
    cr_assert_eq(c.a[1].page_ins, 5);
    /* depth 1: one read at a time */
    jlm_pager_set_prefetch_depth(r.p, 1);
    gate_set(&g, 1);
    cr_assert_eq(jlm_pager_prefetch(r.p, 1, 6), 1);
    cr_assert_eq(jlm_pager_prefetch(r.p, 1, 7), -1, "depth 1: a second read is skipped");
    gate_set(&g, 0);
    check(&r);
    jlm_pager_close(r.p);
    jlm_source_close(r.mem);
    free(r.data);
    pthread_mutex_destroy(&g.mu);
    pthread_cond_destroy(&g.cv);
}

Test(pager, random_gets_with_prefetch_keep_every_invariant_and_every_byte, .timeout = 20)
{
    rig r;
    rig_open(&r, 3, 3, NULL);
    jlm_pager_set_prefetch(r.p, 1);
    uint64_t z = 12345;
    for (int i = 0; i < 3000; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t a = (uint32_t)(z >> 60) & 1, n = a ? NX : NB, pg = (uint32_t)(z >> 33) % n;
        uint64_t len = a ? XPG : PG;
        get_ok(&r, a, pg, 0, len);
        jlm_pager_prefetch(r.p, (uint32_t)(z >> 20) & 1, (uint32_t)(z >> 40) % (a ? NX : NB));
        check(&r);
        jlm_pager_unpin(r.p, a, pg);
        check(&r);
    }
    rig_close(&r);
}

Test(pager, opens_a_container_s_page_arrays_with_the_extent_of_each_page, .timeout = 10)
{
    /* two text blocks of 16 KiB; block 0 holds an F32 (1024 x 2) tensor
     * (8 KiB), block 1 an F32 (1024 x 3) one (12 KiB): extents 8192, 12288 */
    jlm_tensor t[2] = {
        { .role = JLM_R_ATTN_Q, .block = 0, .index = -1, .type = JLM_T_F32, .ndim = 2,
          .dims = { 1024, 2, 1, 1 }, .qs_off = BLK_BASE, .d_off = BLK_BASE, .sc_off = BLK_BASE,
          .name = { "blk.0.attn_q.weight", 19 } },
        { .role = JLM_R_ATTN_Q, .block = 1, .index = -1, .type = JLM_T_F32, .ndim = 2,
          .dims = { 1024, 3, 1, 1 }, .qs_off = BLK_BASE + PG, .d_off = BLK_BASE + PG, .sc_off = BLK_BASE + PG,
          .name = { "blk.1.attn_q.weight", 19 } },
    };
    jlm_model m = { .path = "hand.jlm", .fd = -1, .tensors = t };
    m.hdr = (jlm_header){ .version = JLM_VERSION, .page_size = PG, .n_blocks = 2, .n_tensors = 2,
                          .data_off = BLK_BASE, .vis_data_off = BLK_BASE + 2 * PG, .chunk = 4096,
                          .stream_groups = 1 };
    uint8_t *data = make_content(BLK_BASE + 2 * PG);
    jlm_source *s;
    jlm_err err = { 0 };
    cr_assert_eq(jlm_source_open_mem(data, BLK_BASE + 2 * PG, "hand.jlm", &s, &err), 0);
    jlm_pager *p = NULL;
    cr_assert_eq(jlm_pager_open_model(&m, s, 0, &p, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_pager_frame_len(p, JLM_PAGER_TEXT), 12288, "frame %llu, expected the largest extent 12288",
                 (unsigned long long)jlm_pager_frame_len(p, JLM_PAGER_TEXT));
    const void *ptr;
    cr_assert_eq(jlm_pager_get(p, JLM_PAGER_TEXT, 1, 0, 12288, &ptr, &err), 0, "%s", err.msg);
    check_bytes(ptr, BLK_BASE + PG, 12288, "block 1");
    jlm_pager_unpin(p, JLM_PAGER_TEXT, 1);
    cr_assert_eq(jlm_pager_get(p, JLM_PAGER_TEXT, 0, 0, 8193, &ptr, &err), JLM_EINVAL,
                 "block 0 read past its extent 8192");
    cr_assert_eq(jlm_pager_get(p, JLM_PAGER_EXPERTS, 0, 0, 1, &ptr, &err), JLM_EINVAL, "a dense model has no expert pages");
    cr_assert_eq(jlm_pager_check(p, &err), 0, "%s", err.msg);
    jlm_pager_close(p);
    jlm_source_close(s);
    free(data);
}

/* ---------------------------------------------------------------- source */
typedef struct tmpfile_fix { char dir[256], path[300]; uint8_t *data; size_t len; } tmpfile_fix;

static void tmp_create(tmpfile_fix *t, size_t len)
{
    /* /var/tmp first: usually a disk filesystem, so O_DIRECT is exercised
     * (a tmpfs /tmp refuses it and the source falls back to buffered) */
    static const char *bases[2] = { "/var/tmp", "/tmp" };
    int made = 0;
    for (int i = 0; i < 2 && !made; i++) {
        int n = snprintf(t->dir, sizeof t->dir, "%s/jlm-pager-XXXXXX", bases[i]);
        made = n > 0 && (size_t)n < sizeof t->dir && mkdtemp(t->dir) != NULL;
    }
    cr_assert(made, "mkdtemp: %s", strerror(errno));
    snprintf(t->path, sizeof t->path, "%s/model.jlm", t->dir);
    t->len = len;
    t->data = make_content(len);
    FILE *f = fopen(t->path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(t->data, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

static void tmp_remove(tmpfile_fix *t)
{
    unlink(t->path);
    rmdir(t->dir);
    free(t->data);
}

static void *aligned_buf(size_t n)
{
    void *p = NULL;
    cr_assert_eq(posix_memalign(&p, 4096, n ? n : 4096), 0);
    return p;
}

static void read_and_compare(jlm_source *s, const tmpfile_fix *t, uint64_t off, size_t len, size_t skew)
{
    uint8_t *raw = aligned_buf(len + skew);
    jlm_err err = { 0 };
    int rc = s->read(s, off, len, raw + skew, &err);
    cr_assert_eq(rc, 0, "read [%llu,+%zu): %s", (unsigned long long)off, len, err.msg);
    cr_assert(memcmp(raw + skew, t->data + off, len) == 0, "bytes of [%llu,+%zu) differ from the file",
              (unsigned long long)off, len);
    free(raw);
}

Test(source, direct_reads_give_the_bytes_of_a_buffered_pread_including_an_unaligned_tail, .timeout = 20)
{
    tmpfile_fix t;
    tmp_create(&t, (9u << 20) + 100);                        /* > 4 MiB: split reads; 100-byte tail */
    jlm_source *s = NULL;
    jlm_err err = { 0 };
    jlm_file_source_opts o = { .direct = 1, .n_threads = 3 };
    cr_assert_eq(jlm_source_open_file(t.path, &o, &s, &err), 0, "%s", err.msg);
    cr_log_info("file source on %s: O_DIRECT %s", t.dir, s->direct ? "on" : "refused, buffered");
    cr_assert_eq(s->size, t.len);
    int fd = open(t.path, O_RDONLY);
    uint8_t *ref = malloc(t.len);
    cr_assert_eq(pread(fd, ref, t.len, 0), (ssize_t)t.len);
    close(fd);
    cr_assert(memcmp(ref, t.data, t.len) == 0);
    free(ref);
    size_t aligned_len = t.len & ~(size_t)4095;
    read_and_compare(s, &t, 0, aligned_len, 0);              /* split across threads, direct */
    read_and_compare(s, &t, 4096, 8192, 0);
    read_and_compare(s, &t, 4096, 8192, 7);                  /* unaligned buffer: buffered */
    read_and_compare(s, &t, 123, 5000, 0);                   /* unaligned offset and length */
    read_and_compare(s, &t, aligned_len, 100, 0);            /* the tail */
    read_and_compare(s, &t, aligned_len - 4096, 4196, 0);    /* a span ending at EOF */
    read_and_compare(s, &t, 0, t.len, 0);                    /* the whole file, split, ragged end */
    jlm_source_close(s);
    tmp_remove(&t);
}

typedef struct seam_state { int calls; size_t max; int eintr_every; int eof_at_call; } seam_state;
static seam_state g_seam;   /* the pread seam has no context argument: one test at a time uses it */

static ssize_t seam_pread(int fd, void *buf, size_t n, off_t off)
{
    int c = ++g_seam.calls;
    if (g_seam.eof_at_call && c == g_seam.eof_at_call)
        return 0;
    if (g_seam.eintr_every && c % g_seam.eintr_every == 0) {
        errno = EINTR;
        return -1;
    }
    return pread(fd, buf, n < g_seam.max ? n : g_seam.max, off);
}

Test(source, short_reads_and_eintr_are_retried_until_the_span_is_complete, .timeout = 10)
{
    tmpfile_fix t;
    tmp_create(&t, 64 * 1024);
    g_seam = (seam_state){ .max = 1000, .eintr_every = 3 };
    jlm_file_source_opts o = { .direct = 1, .n_threads = 1, .pread = seam_pread };
    jlm_source *s = NULL;
    jlm_err err = { 0 };
    cr_assert_eq(jlm_source_open_file(t.path, &o, &s, &err), 0, "%s", err.msg);
    read_and_compare(s, &t, 4096, 40960, 0);
    cr_assert_gt(g_seam.calls, 41, "only %d pread calls for 1000-byte short reads", g_seam.calls);
    jlm_source_close(s);
    tmp_remove(&t);
}

Test(source, an_early_end_of_file_or_a_read_past_the_end_names_the_file_and_offset, .timeout = 10)
{
    tmpfile_fix t;
    tmp_create(&t, 3 * 4096 + 100);
    g_seam = (seam_state){ .max = 4096, .eof_at_call = 2 };
    jlm_file_source_opts o = { .direct = 1, .n_threads = 1, .pread = seam_pread };
    jlm_source *s = NULL;
    jlm_err err = { 0 };
    cr_assert_eq(jlm_source_open_file(t.path, &o, &s, &err), 0, "%s", err.msg);
    uint8_t *buf = aligned_buf(4 * 4096);
    int rc = s->read(s, 0, 8192, buf, &err);
    cr_assert_eq(rc, JLM_EIO, "rc %d", rc);
    cr_assert(strstr(err.msg, t.path) && strstr(err.msg, "end of file at offset 4096"), "%s", err.msg);
    rc = s->read(s, 8192, 8192, buf, &err);                  /* 4096+100 bytes exist */
    cr_assert_eq(rc, JLM_EIO, "a read past EOF: rc %d", rc);
    cr_assert(strstr(err.msg, t.path) && strstr(err.msg, "8192"), "%s", err.msg);
    free(buf);
    jlm_source_close(s);
    tmp_remove(&t);
}

Test(source, a_missing_file_is_refused_naming_it, .timeout = 10)
{
    jlm_source *s = NULL;
    jlm_err err = { 0 };
    int rc = jlm_source_open_file("/nonexistent/dir/x.jlm", NULL, &s, &err);
    cr_assert_eq(rc, JLM_EIO);
    cr_assert_null(s);
    cr_assert(strstr(err.msg, "/nonexistent/dir/x.jlm") && strstr(err.msg, "No such file"), "%s", err.msg);
}

/* The engine reads its pages through the descriptor its metadata came from
 * (use_fd), never through the path again: a path replaced after that open
 * (a jlmfs view whose source changed) changes nothing the source reads,
 * buffered or O_DIRECT (the same file opened again through /proc/self/fd),
 * and the caller's descriptor stays open after the source closes. */
Test(source, a_source_on_a_descriptor_reads_that_file_after_its_path_is_replaced, .timeout = 10)
{
    char *dir = tu_tmpdir();
    char a[1100], b[1100];
    snprintf(a, sizeof a, "%s/m.jlm", dir);
    snprintf(b, sizeof b, "%s/m.new", dir);
    enum { N = 8192 };
    uint8_t *va = malloc(N), *vb = malloc(N), *got = aligned_alloc(4096, N);
    cr_assert(va && vb && got);
    memset(va, 'A', N);
    memset(vb, 'B', N);
    cr_assert_eq(tu_write_file(a, va, N), 0);
    int fd = open(a, O_RDONLY);
    cr_assert(fd >= 0);
    cr_assert_eq(tu_write_file(b, vb, N), 0);
    cr_assert_eq(rename(b, a), 0);   /* the path names version B from here */
    for (int direct = 0; direct < 2; direct++)
        for (uint64_t size = 0; size <= N; size += N) {   /* size 0: fstat's */
            jlm_file_source_opts o = {.direct = direct, .n_threads = 1, .use_fd = 1, .fd = fd, .size = size};
            jlm_source *s = NULL;
            jlm_err err = {0};
            cr_assert_eq(jlm_source_open_file(a, &o, &s, &err), 0, "%s", err.msg);
            cr_assert_eq(s->size, N);
            cr_assert(!s->direct || direct, "an O_DIRECT descriptor nobody asked for");
            memset(got, 0, N);
            cr_assert_eq(s->read(s, 0, N, got, &err), 0, "%s", err.msg);
            cr_assert(!memcmp(got, va, N), "direct %d (O_DIRECT used: %d): read the file the path names now", direct,
                      s->direct);
            jlm_source_close(s);
            cr_assert_neq(fcntl(fd, F_GETFD), -1, "the caller's descriptor was closed");
        }
    jlm_source *s = NULL;   /* and by path: the file the path names */
    jlm_err err = {0};
    cr_assert_eq(jlm_source_open_file(a, &(jlm_file_source_opts){.n_threads = 1}, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(s->read(s, 0, N, got, &err), 0, "%s", err.msg);
    cr_assert(!memcmp(got, vb, N));
    jlm_source_close(s);
    close(fd);
    free(va);
    free(vb);
    free(got);
    tu_rmrf(dir);
    free(dir);
}

Test(source, a_pager_over_a_file_source_returns_the_file_bytes_at_a_one_frame_budget, .timeout = 20)
{
    tmpfile_fix t;
    tmp_create(&t, 4096 + 5 * 65536);
    jlm_source *s = NULL;
    jlm_err err = { 0 };
    cr_assert_eq(jlm_source_open_file(t.path, NULL, &s, &err), 0, "%s", err.msg);
    jlm_pager_array_desc d = { .name = "blocks", .cls = JLM_PAGER_BLOCK, .base_off = 4096,
                               .page_size = 65536, .n_pages = 5 };
    jlm_pager_config cfg = { .src = s, .chunk = 8192, .budget = 65536, .n_arrays = 1, .arrays = &d };
    jlm_pager *p = NULL;
    cr_assert_eq(jlm_pager_open(&cfg, &p, &err), 0, "%s", err.msg);
    for (int tok = 0; tok < 2; tok++)
        for (uint32_t b = 0; b < 5; b++) {
            const void *ptr;
            cr_assert_eq(jlm_pager_get(p, 0, b, 1000, 30000, &ptr, &err), 0, "%s", err.msg);
            cr_assert(memcmp(ptr, t.data + 4096 + b * 65536 + 1000, 30000) == 0, "block %u bytes differ", b);
            jlm_pager_unpin(p, 0, b);
            cr_assert_eq(jlm_pager_check(p, &err), 0, "%s", err.msg);
        }
    jlm_pager_close(p);
    jlm_source_close(s);
    tmp_remove(&t);
}

/* Converts a test model with $JLM_BIN into dir; skips (saying why) when the
 * tool is not available. */
static void convert_or_skip(const char *model, const char *out, tmpfile_fix *t)
{
    const char *bin = getenv("JLM_BIN"), *root = getenv("JLM_ROOT");
    if (!bin || access(bin, X_OK) != 0) {
        tmp_remove(t);
        cr_skip_test("JLM_BIN (%s) is not an executable jlm: cannot make a container", bin ? bin : "unset");
    }
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' convert '%s/tests/models/%s' -o '%s' >/dev/null 2>&1", bin,
             root ? root : ".", model, out);
    int rc = system(cmd);
    if (rc != 0) {
        unlink(out);
        tmp_remove(t);
        cr_skip_test("jlm convert %s failed (status %d): the converter's tests cover that", model, rc);
    }
}

/* Every page of every array at the minimum budget, twice, against pread. */
static void page_whole_container(const char *model)
{
    tmpfile_fix t;
    tmp_create(&t, 1);
    char out[400];
    snprintf(out, sizeof out, "%s/m.jlm", t.dir);
    convert_or_skip(model, out, &t);
    jlm_err err = { 0 };
    jlm_model *m = NULL;
    cr_assert_eq(jlm_fmt_open(out, &m, &err), 0, "%s", err.msg);
    jlm_source *s = NULL;
    cr_assert_eq(jlm_source_open_file(out, NULL, &s, &err), 0, "%s", err.msg);
    jlm_pager *p = NULL;
    cr_assert_eq(jlm_pager_open_model(m, s, 0, &p, &err), 0, "%s", err.msg);
    uint32_t pinned[3] = { 1, 1, 1 };
    cr_assert_eq(jlm_pager_set_budget(p, jlm_pager_min_budget(p, pinned), &err), 0, "%s", err.msg);
    int fd = open(out, O_RDONLY);
    uint64_t base[3] = { m->hdr.data_off, m->hdr.vis_data_off, m->hdr.exp_data_off };
    uint64_t psz[3] = { m->hdr.page_size, m->hdr.vis_page_size, m->hdr.exp_page_size };
    uint32_t n[3] = { m->hdr.n_blocks, m->hdr.n_vis_blocks, m->hdr.n_exp_pages };
    uint64_t total = 0;
    for (int rep = 0; rep < 2; rep++)
        for (uint32_t a = 0; a < 3; a++)
            for (uint32_t i = 0; i < n[a]; i++) {
                uint64_t len = jlm_fmt_page_extent(m, (int)a + 1, i);
                const void *ptr;
                cr_assert_eq(jlm_pager_get(p, a, i, 0, len, &ptr, &err), 0, "%s", err.msg);
                uint8_t *ref = malloc(len ? len : 1);
                cr_assert_eq(pread(fd, ref, len, (off_t)(base[a] + i * psz[a])), (ssize_t)len);
                cr_assert(memcmp(ptr, ref, len) == 0, "%s: array %u page %u differs from the file", model, a, i);
                free(ref);
                jlm_pager_unpin(p, a, i);
                cr_assert_eq(jlm_pager_check(p, &err), 0, "%s", err.msg);
                total += len;
            }
    jlm_pager_counters st;
    jlm_pager_stats(p, &st);
    uint64_t got = st.a[0].bytes_read + st.a[1].bytes_read + st.a[2].bytes_read;
    cr_log_info("%s: %u blocks, %u expert pages, %llu bytes paged at a %llu-byte budget", model, n[0], n[2],
                (unsigned long long)got, (unsigned long long)st.budget);
    cr_assert_leq(got, total, "read %llu bytes for %llu requested", (unsigned long long)got, (unsigned long long)total);
    close(fd);
    jlm_pager_close(p);
    jlm_source_close(s);
    jlm_fmt_close(m);
    unlink(out);
    tmp_remove(&t);
}

Test(pager, pages_every_page_of_a_converted_dense_model_at_the_minimum_budget, .timeout = 60)
{
    page_whole_container("stories260K.gguf");
}

Test(pager, pages_every_page_of_a_converted_moe_model_at_the_minimum_budget, .timeout = 60)
{
    page_whole_container("synth-qwen3moe-256.Q4_K_M.gguf");
}

/* ---------------------------------------------------------------- pool */
#define POOL_N 1000
typedef struct cover {
    _Atomic int hits[POOL_N];
    size_t grain, n;
    _Atomic int bad_slice;
    int stall_thread;             /* this thread sleeps in its first piece (-1: none) */
    int lag_caller;               /* the caller sleeps 5 ms in its first piece (the workers claim theirs);
                                   * with a stall_thread, first until that thread is in its stall (2 s at
                                   * most): on a loaded machine a worker can wake later than 5 ms, after the
                                   * caller took every piece, and then nothing stalls */
    _Atomic int stalling;         /* stall_thread is in its stall */
    _Atomic size_t by_thread[8];  /* indices each thread ran */
} cover;

static void cover_fn(void *ctx, size_t b, size_t e, int t)
{
    cover *c = ctx;
    if (b % c->grain || (e % c->grain && e != c->n) || t < 0 || t >= 8)
        atomic_store(&c->bad_slice, 1);
    if (t == c->stall_thread && atomic_load(&c->by_thread[t]) == 0) {
        atomic_store(&c->stalling, 1);
        usleep(200000);
    }
    if (t == 0 && c->lag_caller && atomic_load(&c->by_thread[0]) == 0) {
        for (int i = 0; i < 2000 && c->stall_thread > 0 && !atomic_load(&c->stalling); i++)
            usleep(1000);
        usleep(5000);
    }
    atomic_fetch_add(&c->by_thread[t >= 0 && t < 8 ? t : 0], e - b);
    for (size_t i = b; i < e; i++)
        atomic_fetch_add(&c->hits[i], 1);
}

static void run_cover_as(jlm_pool *pool, cover *c, size_t n, size_t grain, int claim)
{
    for (size_t i = 0; i < POOL_N; i++)
        atomic_store(&c->hits[i], 0);
    for (int t = 0; t < 8; t++)
        atomic_store(&c->by_thread[t], 0);
    atomic_store(&c->stalling, 0);
    c->grain = grain ? grain : 1;
    c->n = n;
    (claim ? jlm_pool_for_claim : jlm_pool_for)(pool, n, grain, cover_fn, c);
    for (size_t i = 0; i < POOL_N; i++) {
        int want = i < n ? 1 : 0, got = atomic_load(&c->hits[i]);
        if (got != want)
            cr_assert_fail("n %zu grain %zu: index %zu ran %d times, expected %d", n, grain, i, got, want);
    }
    cr_assert(!atomic_load(&c->bad_slice), "a slice off a grain boundary or a bad thread (n %zu grain %zu)", n, grain);
}

static void run_cover(jlm_pool *pool, cover *c, size_t n, size_t grain)
{
    c->stall_thread = -1;
    run_cover_as(pool, c, n, grain, 0);
}

Test(pool, parallel_for_covers_every_index_exactly_once_under_repeated_dispatch, .timeout = 30)
{
    jlm_pool *pool = NULL;
    jlm_err err = { 0 };
    cr_assert_eq(jlm_pool_create(3, 0, &pool, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_pool_n_threads(pool), 3);
    static cover c;
    for (int rep = 0; rep < 3000; rep++) {
        size_t n = (size_t)(rep * 7919) % (POOL_N + 1);
        size_t grain = (size_t)(rep % 5) * 3;
        run_cover(pool, &c, n, grain);
    }
    jlm_pool_destroy(pool);
}

/* Claimed pieces: every index once, pieces on grain boundaries, and a
 * thread that stalls in its first piece (200 ms) leaves the rest to the
 * others: it runs that one piece (80 of 1000 indices), where one slice per
 * thread would have held it to a third. */
Test(pool, claimed_pieces_cover_every_index_once_and_a_stalled_thread_leaves_its_share, .timeout = 30)
{
    jlm_pool *pool = NULL;
    jlm_err err = { 0 };
    cr_assert_eq(jlm_pool_create(3, 0, &pool, &err), 0, "%s", err.msg);
    static cover c;
    c.stall_thread = -1;
    for (int rep = 0; rep < 3000; rep++) {
        size_t n = (size_t)(rep * 7919) % (POOL_N + 1);
        run_cover_as(pool, &c, n, (size_t)(rep % 5) * 3, 1);
    }
    for (int t = 1; t < 3; t++) {
        c.stall_thread = t;
        run_cover_as(pool, &c, POOL_N, 4, 1);
        size_t mine = atomic_load(&c.by_thread[t]);
        cr_assert(mine <= 80, "thread %d stalled in its first piece yet ran %zu of %d indices", t, mine, POOL_N);
    }
    jlm_pool_destroy(pool);
}

/* A stalled worker (pool.h): the 200 ms stall of thread 1 in its first piece
 * starts a solo period, so the next dispatches, claimed or not, run on the
 * caller alone, covering every index once; JLM_POOL=claim never goes solo, and
 * JLM_POOL=static splits a claimed dispatch into one slice per thread (the
 * stalled thread runs its third). */
static jlm_pool *pool_in_mode(const char *mode)
{
    jlm_pool *pool = NULL;
    jlm_err err = { 0 };
    if (mode)
        setenv("JLM_POOL", mode, 1);
    else
        unsetenv("JLM_POOL");
    /* workers that spin instead of sleeping: a dispatch that wakes a sleeper
     * is no evidence of a stall (pool.c), and a loaded machine could let
     * them fall asleep before the first one */
    cr_assert_eq(jlm_pool_create(2, 1u << 30, &pool, &err), 0, "%s", err.msg);
    unsetenv("JLM_POOL");
    return pool;
}

Test(pool, a_stalled_worker_sends_claimed_dispatches_to_the_caller_for_a_while, .timeout = 30)
{
    static cover c;
    jlm_pool *pool = pool_in_mode(NULL);
    c.stall_thread = 1;
    c.lag_caller = 1;
    run_cover_as(pool, &c, POOL_N, 4, 1);
    cr_assert_eq(jlm_pool_stalls(pool), 1, "stalls: %llu", jlm_pool_stalls(pool));
    c.stall_thread = -1;
    run_cover_as(pool, &c, POOL_N, 4, 1);
    cr_assert_eq(atomic_load(&c.by_thread[0]), POOL_N, "the caller ran %zu of %d", atomic_load(&c.by_thread[0]), POOL_N);
    run_cover_as(pool, &c, POOL_N, 4, 0);   /* jlm_pool_for: on the caller too while solo */
    cr_assert_eq(atomic_load(&c.by_thread[0]), POOL_N, "jlm_pool_for: the caller ran %zu of %d",
                 atomic_load(&c.by_thread[0]), POOL_N);
    jlm_pool_destroy(pool);

    pool = pool_in_mode("claim");
    c.stall_thread = 1;
    run_cover_as(pool, &c, POOL_N, 4, 1);
    cr_assert_eq(jlm_pool_stalls(pool), 0, "JLM_POOL=claim went solo");
    cr_assert(atomic_load(&c.by_thread[1]) <= 124, "claimed: the stalled thread ran %zu, more than its piece",
              atomic_load(&c.by_thread[1]));
    jlm_pool_destroy(pool);

    pool = pool_in_mode("static");
    run_cover_as(pool, &c, POOL_N, 4, 1);
    cr_assert_eq(atomic_load(&c.by_thread[1]), POOL_N / 2, "static: the stalled thread ran %zu", atomic_load(&c.by_thread[1]));
    cr_assert_eq(jlm_pool_stalls(pool), 0);
    jlm_pool_destroy(pool);
    c.lag_caller = 0;
    c.stall_thread = -1;
}

/* Claimed dispatches return once every piece has run, without waiting for a
 * worker that took none: with workers that sleep after one wait step, most
 * wake after the caller took every piece and join a dispatch that has
 * returned (or a later one). None may run a piece of a returned dispatch:
 * every index of every dispatch runs once, and none between dispatches (the
 * hits of the last one, checked again after a pause, stay as they were). */
Test(pool, claimed_dispatches_never_give_a_late_worker_a_piece_of_a_returned_one, .timeout = 60)
{
    jlm_pool *pool = NULL;
    jlm_err err = { 0 };
    cr_assert_eq(jlm_pool_create(3, 1, &pool, &err), 0, "%s", err.msg);
    static cover c;
    c.stall_thread = -1;
    size_t by_workers = 0;
    for (int rep = 0; rep < 4000; rep++) {
        size_t n = 8 + (size_t)(rep * 7919) % (POOL_N - 7);
        run_cover_as(pool, &c, n, (size_t)(rep % 3) + 1, 1);
        by_workers += atomic_load(&c.by_thread[1]) + atomic_load(&c.by_thread[2]);
        if (rep % 500 == 0) {
            usleep(3000);   /* late workers arrive; the dispatch's hits must not change */
            for (size_t i = 0; i < POOL_N; i++)
                cr_assert_eq(atomic_load(&c.hits[i]), i < n ? 1 : 0, "rep %d: index %zu ran again after the dispatch", rep, i);
        }
    }
    cr_log_info("workers ran %zu of the indices", by_workers);
    jlm_pool_destroy(pool);
}

/* CLOCK_MONOTONIC in ns. */
static unsigned long long mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

/* Two threads on one CPU, as when a neighbour holds the other core and the
 * scheduler puts both threads on this one: the pool is made on two CPUs (so
 * it spins rather than yields, as it does beside a neighbour), then every
 * thread of the process is pinned to the caller's CPU. Pieces of ~0.5-2 ms:
 * the worker's run on the caller's CPU, so what it gains the caller loses,
 * and the caller spins for the piece it holds; the pool goes solo, and the
 * next dispatch runs on the caller alone. Skipped on one CPU. */
typedef struct burn { _Atomic size_t by_thread[2]; } burn;
static void burn_fn(void *ctx, size_t b, size_t e, int t)
{
    burn *w = ctx;
    volatile unsigned long x = 0;
    for (size_t i = b; i < e; i++)
        for (int k = 0; k < 1000000; k++)
            x += (unsigned long)k * i;
    atomic_fetch_add(&w->by_thread[t > 0], e - b);
}

Test(pool, two_threads_sharing_one_cpu_go_solo, .timeout = 60)
{
    cpu_set_t all, one;
    cr_assert_eq(sched_getaffinity(0, sizeof all, &all), 0);
    if (CPU_COUNT(&all) < 2)
        cr_skip_test("one CPU: a pool of two threads there is oversubscribed and yields");
    setenv("JLM_POOL", "", 1);
    jlm_pool *pool = NULL;
    jlm_err err = { 0 };
    cr_assert_eq(jlm_pool_create(2, 0, &pool, &err), 0, "%s", err.msg);
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &one);
    DIR *tasks = opendir("/proc/self/task");
    cr_assert(tasks, "/proc/self/task: %s", strerror(errno));
    int pinned = 0;
    for (struct dirent *d; (d = readdir(tasks));)
        if (d->d_name[0] != '.' && sched_setaffinity((pid_t)atoi(d->d_name), sizeof one, &one) == 0)
            pinned++;
    closedir(tasks);
    cr_assert_geq(pinned, 2, "pinned %d threads", pinned);
    static burn w;
    size_t by_worker = 0;
    int rep = 0;
    cr_assert_eq(jlm_pool_solo_ns(pool), 0, "no solo period yet, %llu ns alone", jlm_pool_solo_ns(pool));
    cr_assert_eq(jlm_pool_solo_ns(NULL), 0);
    unsigned long long t_loop = mono_ns();
    for (; rep < 100 && jlm_pool_stalls(pool) == 0; rep++) {
        jlm_pool_for_claim(pool, 16, 1, burn_fn, &w);
        by_worker = atomic_load(&w.by_thread[1]);
    }
    cr_assert_geq(jlm_pool_stalls(pool), 1, "%d dispatches on one CPU (the worker ran %zu of %d pieces) and the pool stayed split",
                  rep, by_worker, 16 * rep);
    atomic_store(&w.by_thread[0], 0);
    atomic_store(&w.by_thread[1], 0);
    unsigned long long t_a = mono_ns();
    jlm_pool_for_claim(pool, 16, 1, burn_fn, &w);
    unsigned long long t_b = mono_ns();
    cr_assert_eq(atomic_load(&w.by_thread[1]), 0, "solo: the worker ran %zu of 16", atomic_load(&w.by_thread[1]));
    /* the solo period in force is counted (a dispatch begun in it runs solo to its end, which
     * may be past the period's), and no more than the time since the loop began */
    unsigned long long alone = jlm_pool_solo_ns(pool);
    unsigned long long t_c = mono_ns();
    cr_assert(alone > 0 && alone <= t_c - t_loop, "%llu ns alone: the solo dispatch took %llu, the test %llu",
              alone, t_b - t_a, t_c - t_loop);
    jlm_pool_destroy(pool);
}

/* Profiling: counted only while on; per dispatch each thread's slice and
 * wait times add up to the dispatch's wall time, so the sums are n_threads x
 * the wall; reset zeroes them. */
Test(pool, profiling_counts_dispatches_only_while_on, .timeout = 30)
{
    jlm_pool *pool = NULL;
    jlm_err err = { 0 };
    cr_assert_eq(jlm_pool_create(3, 0, &pool, &err), 0, "%s", err.msg);
    static cover c;
    jlm_pool_stats st;
    run_cover(pool, &c, POOL_N, 4);
    jlm_pool_stats_get(pool, &st);
    cr_assert_eq(st.dispatches, 0, "profiling off: nothing counted");
    jlm_pool_profile(pool, 1);
    for (int rep = 0; rep < 100; rep++)
        run_cover(pool, &c, POOL_N, 4);
    run_cover(pool, &c, 2, 4);   /* one grain: runs on the caller, no dispatch */
    jlm_pool_stats_get(pool, &st);
    cr_assert_eq(st.dispatches, 100);
    cr_assert(st.wall_ns > 0 && st.busy_ns > 0, "wall %llu busy %llu", st.wall_ns, st.busy_ns);
    cr_assert(st.wait_ns + st.busy_ns <= 3 * st.wall_ns, "thread time %llu + %llu exceeds 3 threads x wall %llu",
              st.wait_ns, st.busy_ns, st.wall_ns);
    jlm_pool_stats_reset(pool);
    jlm_pool_stats_get(pool, &st);
    cr_assert(st.dispatches == 0 && st.wall_ns == 0 && st.wait_ns == 0 && st.busy_ns == 0);
    jlm_pool_destroy(pool);
}

Test(pool, workers_asleep_after_idling_still_take_the_next_job, .timeout = 30)
{
    jlm_pool *pool = NULL;
    jlm_err err = { 0 };
    cr_assert_eq(jlm_pool_create(4, 100, &pool, &err), 0, "%s", err.msg);
    static cover c;
    for (int rep = 0; rep < 20; rep++) {
        usleep(2000);
        run_cover(pool, &c, POOL_N, 16);
    }
    jlm_pool_destroy(pool);
    run_cover(NULL, &c, 77, 1);                              /* no pool: runs on the caller */
}

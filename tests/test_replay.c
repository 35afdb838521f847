/* test_replay.c - the routing replay of bench/routing_replay.c: its parser
 * refuses malformed traces with a line naming the place, and its LRU, LFU
 * and Belady simulations give the miss counts worked out by hand on small
 * traces (the classic reference string 1 2 3 4 1 2 5 1 2 3 4 5 with three
 * frames: LRU 10 misses, the optimum 7), and AUTO (engine/xadapt.h) picks
 * the half-life that fits the trace. */
#define ROUTING_REPLAY_NO_MAIN
#include "bench/routing_replay.c"

#include <criterion/criterion.h>

/* A trace from text (through a memory stream); 0 or -1 with msg. */
static int parse_text(const char *text, rr_trace *t, char *msg, size_t msz)
{
    FILE *f = fmemopen((void *)text, strlen(text), "r");
    cr_assert(f);
    int rc = rr_parse(f, "t.trace", t, msg, msz);
    fclose(f);
    return rc;
}

/* A trace that must parse. */
static void parse_ok(const char *text, rr_trace *t)
{
    char msg[256];
    cr_assert_eq(parse_text(text, t, msg, sizeof msg), 0, "%s", msg);
}

/* One block of 8 experts, one used: the reference string as positions 0.. */
static void classic(rr_trace *t)
{
    static const int ref[] = {1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5};
    char text[1024];
    int n = snprintf(text, sizeof text, "# jlm routing trace 1 n_layer 1 n_expert 8 n_used 1 expert_bytes 1000000\n");
    for (int i = 0; i < 12; i++)
        n += snprintf(text + n, sizeof text - (size_t)n, "%d 0 %d\n", i, ref[i]);
    parse_ok(text, t);
}

Test(replay, belady_and_lru_match_the_hand_counts_of_the_classic_string)
{
    rr_trace t;
    classic(&t);
    cr_assert_eq(t.n_tokens, 12);
    cr_assert_eq(rr_misses(&t, RR_OPT, 3, 1.0), 7, "optimum, 3 frames");
    cr_assert_eq(rr_misses(&t, RR_LRU, 3, 1.0), 10, "LRU, 3 frames");
    cr_assert_eq(rr_misses(&t, RR_OPT, 4, 1.0), 6, "optimum, 4 frames: 5 cold + 1 (5 evicts 3 or 4, both used again)");
    cr_assert_eq(rr_misses(&t, RR_LRU, 4, 1.0), 8, "LRU, 4 frames");
    cr_assert_eq(rr_misses(&t, RR_OPT, 5, 1.0), 5, "every page fits: the cold misses");
    rr_free(&t);
}

/* 1 1 1 2 3 1 at two frames: LFU keeps the thrice-used 1 (3 evicts 2: 3
 * misses), LRU evicts 1 for 3 and misses it again (4); with a half-life
 * far below one get, counts are gone at once and LFU is LRU. */
Test(replay, lfu_keeps_the_frequent_expert_that_lru_evicts)
{
    const char *text = "# jlm routing trace 1 n_layer 1 n_expert 4 n_used 1 expert_bytes 4096\n"
                       "0 0 1\n1 0 1\n2 0 1\n3 0 2\n4 0 3\n5 0 1\n";
    rr_trace t;
    parse_ok(text, &t);
    cr_assert_eq(rr_misses(&t, RR_LFU, 2, 1e6), 3);
    cr_assert_eq(rr_misses(&t, RR_LRU, 2, 1e6), 4);
    cr_assert_eq(rr_misses(&t, RR_LFU, 2, 1e-6), 4);
    cr_assert_eq(rr_misses(&t, RR_OPT, 2, 1.0), 3);
    rr_free(&t);
}

/* One block of 64 experts, one used a token, the pages `seq` gotten in turn. */
static void seq_trace(const int *seq, int n, rr_trace *t)
{
    char *text = malloc(64 + (size_t)n * 16);
    cr_assert(text);
    int k = sprintf(text, "# jlm routing trace 1 n_layer 1 n_expert 64 n_used 1 expert_bytes 4096\n");
    for (int i = 0; i < n; i++)
        k += sprintf(text + k, "%d 0 %d\n", i, seq[i]);
    parse_ok(text, t);
    free(text);
}

/* Which candidate the shadows pick after `seq` at 8 expert pages. */
static int auto_pick(const int *seq, int n)
{
    jlm_xadapt *a = jlm_xa_new(64, 1, 64);
    cr_assert(a);
    for (int i = 0; i < n; i++)
        jlm_xa_get(a, (uint32_t)seq[i], (uint64_t)i, 8);
    int pick = jlm_xa_pick(a);
    for (int k = 0; k < JLM_XA_K; k++)   /* the pick missed least */
        cr_assert_leq(jlm_xa_misses(a, pick), jlm_xa_misses(a, k), "candidate %d missed less than %d", k, pick);
    jlm_xa_free(a);
    return pick;
}

/* 8 frames. Phases: 6 experts gotten 5 times each, round robin, then never
 * again (a working set that moves on): a long memory keeps the last
 * phase's 5-count experts and evicts each new one at its first miss, so
 * recency wins. A hot set: 6 experts gotten every other get between
 * experts that come back only after 116 gets: recency evicts the hot ones
 * (11 others between two gets of one), a count that outlives the hot
 * set's period of 12 gets keeps them. AUTO must pick recency (its first
 * candidate: one get) in the first and a count (any other: 16 gets or
 * more) in the second, and read less than the policy that loses in each. */
Test(replay, auto_picks_recency_for_a_moving_working_set_and_counts_for_a_hot_set)
{
    enum { N = 300 };
    int moving[N], hot[N];
    for (int i = 0; i < N; i++) {
        int phase = i / 30, j = i % 30;
        moving[i] = (phase * 6 + j % 6) % 64;
        hot[i] = i % 2 == 0 ? (i / 2) % 6 : 6 + (i / 2) % 58;
    }
    cr_assert_eq(auto_pick(moving, N), 0);
    cr_assert_geq(auto_pick(hot, N), 1);
    rr_trace t;
    seq_trace(moving, N, &t);
    uint64_t lru = rr_misses(&t, RR_LRU, 8, 1.0), lfu = rr_misses(&t, RR_LFU, 8, 4.0), au = rr_misses(&t, RR_AUTO, 8, 1.0);
    cr_assert_lt(lru, lfu, "moving: LRU %llu, LFU %llu", (unsigned long long)lru, (unsigned long long)lfu);
    cr_assert_lt(au, lfu, "moving: AUTO %llu, LFU %llu", (unsigned long long)au, (unsigned long long)lfu);
    rr_free(&t);
    seq_trace(hot, N, &t);
    lru = rr_misses(&t, RR_LRU, 8, 1.0), lfu = rr_misses(&t, RR_LFU, 8, 4.0), au = rr_misses(&t, RR_AUTO, 8, 1.0);
    cr_assert_lt(lfu, lru, "hot: LFU %llu, LRU %llu", (unsigned long long)lfu, (unsigned long long)lru);
    cr_assert_lt(au, lru, "hot: AUTO %llu, LRU %llu", (unsigned long long)au, (unsigned long long)lru);
    rr_free(&t);
}

/* 4 MoE blocks of 8 experts, one routed each, the same one at every token,
 * and 3 frames for the 4 pages a token gets: a cyclic scan. LRU (and LFU,
 * whose equal counts tie to LRU) evicts the page needed next and misses at
 * every get; NEXT evicts the page of the block just run, a whole cycle
 * away, and misses once a token. AUTO must pick NEXT and read as little. */
Test(replay, auto_picks_next_for_a_cyclic_scan_of_the_blocks)
{
    enum { T = 40 };
    jlm_xadapt *a = jlm_xa_new(32, 1, 8);
    cr_assert(a);
    char text[T * 4 * 16 + 128];
    int n = sprintf(text, "# jlm routing trace 1 n_layer 4 n_expert 8 n_used 1 expert_bytes 4096\n");
    for (int t = 0; t < T; t++)
        for (int b = 0; b < 4; b++) {
            jlm_xa_get(a, (uint32_t)(b * 8 + 3), (uint64_t)(t * 4 + b), 3);
            n += sprintf(text + n, "%d %d 3\n", t, b);
        }
    cr_assert_eq(jlm_xa_pick(a), JLM_XA_NEXT);
    jlm_xa_free(a);
    rr_trace tr;
    parse_ok(text, &tr);
    uint64_t lru = rr_misses(&tr, RR_LRU, 3, 1.0), lfu = rr_misses(&tr, RR_LFU, 3, 1.0);
    uint64_t next = rr_misses(&tr, RR_NEXT, 3, JLM_XP_NEXT_HALF_LIFE), au = rr_misses(&tr, RR_AUTO, 3, 1.0);
    cr_assert_eq(lru, 4 * T);
    cr_assert_eq(lfu, 4 * T);
    cr_assert_lt(next, 2 * T, "NEXT %llu misses", (unsigned long long)next);
    cr_assert_lt(au, 2 * T, "AUTO %llu misses (NEXT %llu)", (unsigned long long)au, (unsigned long long)next);
    rr_free(&tr);
}

/* Two experts a routing, three frames, A B C D = 0 1 2 3: B and D three
 * times, then (B, A), (A, C), (A, B). At (A, C) the counts are A 2 (just
 * gotten), D 3, B 4: A is the lowest but pinned by its routing, so C evicts
 * D and the last routing hits both: 4 misses under every policy (LFU
 * evicting A would make 5). Lines out of order are replayed by (position,
 * block). */
Test(replay, a_routing_s_experts_are_never_each_other_s_victims)
{
    const char *text = "# jlm routing trace 1 n_layer 2 n_expert 4 n_used 2 expert_bytes 4096\n"
                       "5 0 0 1\n0 0 1 3\n1 0 1 3\n2 0 1 3\n3 0 1 0\n4 0 0 2\n0 1 2 3\n";
    rr_trace t;
    parse_ok(text, &t);
    cr_assert_eq(t.n_tokens, 6);
    cr_assert_eq(t.page[0], 1);       /* (0, block 0) first */
    cr_assert_eq(t.page[2], 6);       /* then (0, block 1): block 1's expert 2 */
    cr_assert_eq(t.page[12], 0);      /* position 5 last */
    /* block 1's pair is used once: 2 cold misses on top of block 0's 4, in frames
     * of their own at 5 slots */
    for (int pol = 0; pol < 3; pol++)
        cr_assert_eq(rr_misses(&t, pol, 5, 1e9), 6, "policy %d", pol);
    rr_free(&t);
    const char *one = "# jlm routing trace 1 n_layer 1 n_expert 4 n_used 2 expert_bytes 4096\n"
                      "5 0 0 1\n0 0 1 3\n1 0 1 3\n2 0 1 3\n3 0 1 0\n4 0 0 2\n";
    parse_ok(one, &t);
    for (int pol = 0; pol < 3; pol++)
        cr_assert_eq(rr_misses(&t, pol, 3, 1e9), 4, "policy %d", pol);
    rr_free(&t);
}

Test(replay, malformed_traces_are_refused_with_the_line)
{
    static const struct { const char *text, *want; } bad[] = {
        {"", "t.trace:1: expected '# jlm routing trace 1"},
        {"# jlm routing trace 1 n_layer 1 n_expert 4 n_used 5 expert_bytes 1\n0 0 1\n", "t.trace:1:"},
        {"# jlm routing trace 1 n_layer 1 n_expert 4 n_used 1 expert_bytes 1\n", "t.trace:1: no routing lines"},
        {"# jlm routing trace 1 n_layer 1 n_expert 4 n_used 1 expert_bytes 1\n0 0 4\n", "t.trace:2: expected n_used expert ids"},
        {"# jlm routing trace 1 n_layer 1 n_expert 4 n_used 1 expert_bytes 1\n0 1 0\n", "t.trace:2: expected 'POS BLOCK"},
        {"# jlm routing trace 1 n_layer 1 n_expert 4 n_used 2 expert_bytes 1\n0 0 1\n", "t.trace:2: expected n_used"},
        {"# jlm routing trace 1 n_layer 1 n_expert 4 n_used 1 expert_bytes 1\n0 0 1 2\n", "t.trace:2: more fields"},
        {"# jlm routing trace 1 n_layer 1 n_expert 4 n_used 1 expert_bytes 1\n0 0 -1\n", "t.trace:2: expected n_used"},
        {"# jlm routing trace 1 n_layer 1 n_expert 4 n_used 1 expert_bytes 1\n0 0 1\n99999999999 0 1\n",
         "t.trace:3: expected 'POS BLOCK"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rr_trace t;
        char msg[256] = "";
        cr_assert_eq(parse_text(bad[i].text, &t, msg, sizeof msg), -1, "case %zu accepted", i);
        cr_assert(strstr(msg, bad[i].want), "case %zu: '%s' does not say '%s'", i, msg, bad[i].want);
        cr_assert_null(t.page);
    }
}

/* jlm_routing_order (the background read's order for --warm-from): most
 * routed first, ties and the never routed in page order; a layer without
 * experts (rank UINT32_MAX) is passed over and the layers after it are
 * packed (a leading dense block); a rank past the pages is refused. */
Test(replay, the_warm_order_puts_the_most_routed_experts_first)
{
    /* 3 layers of 4 experts, 2 used; layer 0 dense (its lines ignored) */
    const char *text = "# jlm routing trace 1 n_layer 3 n_expert 4 n_used 2 expert_bytes 4096\n"
                       "0 0 3 2\n0 1 2 0\n0 2 1 3\n"
                       "1 0 3 2\n1 1 2 3\n1 2 1 0\n"
                       "2 1 2 0\n2 2 3 1\n";
    rr_trace t;
    parse_ok(text, &t);
    const uint32_t rank[3] = {UINT32_MAX, 0, 1};
    uint32_t order[8];
    jlm_err err = {0};
    cr_assert_eq(jlm_routing_order(&t, rank, 8, order, &err), 0, "%s", err.msg);
    /* counts by page (layer 1 -> pages 0-3, layer 2 -> 4-7):
     * p0 2, p1 0, p2 3, p3 1; p4 1, p5 3, p6 0, p7 2 */
    static const uint32_t want[8] = {2, 5, 0, 7, 3, 4, 1, 6};
    for (int i = 0; i < 8; i++)
        cr_assert_eq(order[i], want[i], "order[%d]: page %u, want %u", i, order[i], want[i]);
    const uint32_t wide[3] = {UINT32_MAX, 0, 2};   /* block 2 of 4 experts: pages 8-11, past 8 */
    cr_assert_eq(jlm_routing_order(&t, wide, 8, order, &err), JLM_EINVAL, "a rank past the pages accepted");
    cr_assert(strstr(err.msg, "layer 2"), "%s", err.msg);
    rr_free(&t);
}

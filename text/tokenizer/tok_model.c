/* tok_model.c - the three tokenizer models on one raw text fragment:
 * SPM (llama.cpp's llm_tokenizer_spm_session: bigram merges by score),
 * byte-level BPE (llm_tokenizer_bpe_session: merges by rank) and WPM
 * (llm_tokenizer_wpm_session: BERT normalisation + greedy longest match).
 *
 * Cost: SPM and BPE are O(m log m) per word of m characters (a binary heap
 * of candidate pairs, stale entries skipped on pop); WPM is O(m * L) per word
 * with L the longest token in bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer/tokenizer_int.h"

/* ================================================================ symbols and the pair heap */
typedef struct sym { int prev, next; const char *text; size_t n; } sym;

typedef struct pair {
    int    left, right;
    float  score;          /* SPM: token score (higher first) */
    int32_t rank;          /* BPE: merge rank (lower first) */
    size_t ln, rn;         /* sizes of the two symbols when pushed (staleness check) */
} pair;

typedef struct heap { pair *p; size_t n, cap; int oom; int bpe; } heap;

/* 1 if a pops before b: llama.cpp's comparators (score desc / rank asc, then left asc). */
static int before(const heap *h, const pair *a, const pair *b)
{
    if (h->bpe) {
        if (a->rank != b->rank)
            return a->rank < b->rank;
    } else if (a->score != b->score) {
        return a->score > b->score;
    }
    return a->left < b->left;
}

static void heap_push(heap *h, pair x)
{
    if (h->oom)
        return;
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 64;
        pair *np = realloc(h->p, cap * sizeof(pair));
        if (!np) {
            h->oom = 1;
            return;
        }
        h->p = np;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!before(h, &x, &h->p[up]))
            break;
        h->p[i] = h->p[up];
        i = up;
    }
    h->p[i] = x;
}

static pair heap_pop(heap *h)
{
    pair top = h->p[0], x = h->p[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const pair *best = &x;
        if (l < h->n && before(h, &h->p[l], best)) { m = l; best = &h->p[l]; }
        if (r < h->n && before(h, &h->p[r], best)) { m = r; }
        if (m == i)
            break;
        h->p[i] = h->p[m];
        i = m;
    }
    if (h->n)
        h->p[i] = x;
    return top;
}

/* Splits text into one symbol per UTF-8 character (unicode_len_utf8 of the lead byte). */
static sym *make_syms(const char *text, size_t len, size_t *n_out)
{
    sym *s = malloc((len ? len : 1) * sizeof(sym));
    if (!s)
        return NULL;
    size_t n = 0;
    for (size_t off = 0; off < len;) {
        size_t cl = jlm_tok_utf8_len((uint8_t)text[off]);
        if (cl > len - off)
            cl = len - off;
        s[n] = (sym){(int)n - 1, off + cl == len ? -1 : (int)n + 1, text + off, cl};
        off += cl;
        n++;
    }
    *n_out = n;
    return s;
}

/* Merges the pair's right symbol into its left one. */
static void merge(sym *s, const pair *b)
{
    sym *l = &s[b->left], *r = &s[b->right];
    l->n += r->n;
    r->n = 0;
    l->next = r->next;
    if (r->next >= 0)
        s[r->next].prev = b->left;
}

/* ================================================================ SPM */
static void spm_try(const jlm_tok *t, const sym *s, heap *h, int left, int right, char *scratch)
{
    if (left < 0 || right < 0)
        return;
    size_t n = s[left].n + s[right].n;
    memcpy(scratch, s[left].text, n);   /* the two symbols are adjacent in the text */
    int32_t id = jlm_tok_lookup(t, scratch, n);
    if (id < 0)
        return;
    float score = t->v->n_scores ? t->v->scores[id] : 0.0f;
    heap_push(h, (pair){left, right, score, 0, s[left].n, s[right].n});
}

static void spm_emit(const jlm_tok *t, const sym *sy, tok_ids *out)
{
    int32_t id = jlm_tok_lookup(t, sy->text, sy->n);
    if (id >= 0) {
        jlm_tok_ids_push(out, id);
        return;
    }
    /* A symbol that is not a token is a single character (merged symbols are
     * always tokens): output it as byte tokens, llama.cpp's byte fallback. */
    if (!t->v->byte_fallback) {
        if (t->v->unk >= 0)
            jlm_tok_ids_push(out, t->v->unk);
        return;
    }
    for (size_t j = 0; j < sy->n; j++) {
        int32_t b = t->byte_tok[(uint8_t)sy->text[j]];
        if (b < 0)
            b = t->v->unk;
        if (b >= 0)
            jlm_tok_ids_push(out, b);
    }
}

int jlm_tok_spm(const jlm_tok *t, const char *text, size_t len, tok_ids *out)
{
    size_t n = 0;
    sym *s = make_syms(text, len, &n);
    char *scratch = malloc(len + 1);
    heap h = {.bpe = 0};
    int rc = (!s || !scratch) ? JLM_ENOMEM : JLM_OK;
    for (size_t i = 1; i < n && !rc; i++)
        spm_try(t, s, &h, (int)i - 1, (int)i, scratch);
    while (!rc && h.n && !h.oom) {
        pair b = heap_pop(&h);
        sym *l = &s[b.left], *r = &s[b.right];
        if (!l->n || !r->n || l->n + r->n != b.ln + b.rn)
            continue;
        merge(s, &b);
        spm_try(t, s, &h, l->prev, b.left, scratch);
        spm_try(t, s, &h, b.left, l->next, scratch);
    }
    if (h.oom)
        rc = JLM_ENOMEM;
    for (int i = n ? 0 : -1; i != -1 && !rc; i = s[i].next)
        spm_emit(t, &s[i], out);
    free(h.p);
    free(scratch);
    free(s);
    return rc ? rc : (out->oom ? JLM_ENOMEM : JLM_OK);
}

/* ================================================================ BPE */
static void bpe_try(const jlm_tok *t, const sym *s, heap *h, int left, int right)
{
    if (left < 0 || right < 0)
        return;
    int32_t rank = jlm_tok_merge_rank(t, s[left].text, s[left].n, s[right].text, s[right].n);
    if (rank < 0)
        return;
    heap_push(h, (pair){left, right, 0.0f, rank, s[left].n, s[right].n});
}

static void bpe_emit(const jlm_tok *t, const sym *sy, tok_ids *out)
{
    int32_t id = jlm_tok_lookup(t, sy->text, sy->n);
    if (id >= 0) {
        jlm_tok_ids_push(out, id);
        return;
    }
    for (size_t j = 0; j < sy->n; j++) {   /* llama.cpp: each byte as a 1-byte token, else dropped */
        int32_t b = t->byte_level ? jlm_tok_lookup(t, sy->text + j, 1) : t->byte_tok[(uint8_t)sy->text[j]];
        if (b >= 0)
            jlm_tok_ids_push(out, b);
    }
}

static int bpe_word(const jlm_tok *t, const char *w, size_t wl, tok_ids *out)
{
    size_t n = 0;
    sym *s;
    if (t->v->ignore_merges && jlm_tok_lookup(t, w, wl) >= 0) {
        s = malloc(sizeof(sym));
        if (s) {
            s[0] = (sym){-1, -1, w, wl};
            n = 1;
        }
    } else {
        s = make_syms(w, wl, &n);
    }
    if (!s)
        return JLM_ENOMEM;
    heap h = {.bpe = 1};
    for (size_t i = 1; i < n; i++)
        bpe_try(t, s, &h, (int)i - 1, (int)i);
    while (h.n && !h.oom) {
        pair b = heap_pop(&h);
        sym *l = &s[b.left], *r = &s[b.right];
        if (!l->n || !r->n || l->n != b.ln || r->n != b.rn)
            continue;
        merge(s, &b);
        bpe_try(t, s, &h, l->prev, b.left);
        bpe_try(t, s, &h, b.left, l->next);
    }
    int rc = h.oom ? JLM_ENOMEM : JLM_OK;
    for (size_t i = 0; i < n && !rc; i++)   /* array order = chain order for live symbols */
        if (s[i].n)
            bpe_emit(t, &s[i], out);
    free(h.p);
    free(s);
    return rc;
}

int jlm_tok_bpe(const jlm_tok *t, const char *text, size_t len, tok_ids *out)
{
    tok_sbuf words = {0};
    tok_lens lens = {0};
    int rc = jlm_tok_pre_split(t, text, len, &words, &lens);
    size_t off = 0;
    for (size_t i = 0; i < lens.n && !rc; i++) {
        rc = bpe_word(t, words.p + off, lens.p[i], out);
        off += lens.p[i];
    }
    free(words.p);
    free(lens.p);
    return rc ? rc : (out->oom ? JLM_ENOMEM : JLM_OK);
}

/* ================================================================ WPM */
static int is_chinese(uint32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* Greedy longest match of "\u2581" + word; all or nothing, else [UNK]. */
static void wpm_word(const jlm_tok *t, const char *w, size_t n, tok_ids *out)
{
    size_t mark = out->n;
    for (size_t i = 0; i < n; i++) {
        size_t j = i + t->max_token_len + 1 < n ? i + t->max_token_len + 1 : n;
        int32_t id = -1;
        for (; j > i; j--)
            if ((id = jlm_tok_lookup(t, w + i, j - i)) >= 0)
                break;
        if (id < 0) {
            out->n = mark;
            break;
        }
        jlm_tok_ids_push(out, id);
        i = j - 1;
    }
    if (out->n == mark && t->v->unk >= 0)
        jlm_tok_ids_push(out, t->v->unk);
}

int jlm_tok_wpm(const jlm_tok *t, const char *text, size_t len, tok_ids *out)
{
    tok_cpts cp = {0};
    tok_sbuf w = {0};
    jlm_tok_cpts_from_utf8(text, len, &cp);
    jlm_tok_sbuf_put(&w, "\xe2\x96\x81", 3);
    for (size_t i = 0; i <= cp.n && !cp.oom; i++) {
        uint32_t c = i < cp.n ? cp.p[i] : ' ';
        if (t->wpm_strip)
            c = jlm_tok_nfd_first(c);
        uint32_t f = jlm_tok_flags(c);
        int single = !(f & TF_WS) && ((f & TF_PUNCT) || (c < 0x7F && (f & TF_SYMBOL)) || is_chinese(c));
        if ((f & TF_WS) || single) {            /* finish the word in progress */
            if (w.n > 3)
                wpm_word(t, w.p, w.n, out);
            w.n = 3;
            if (!single)
                continue;
        }
        if (c == 0 || c == 0xFFFD || (f & TF_CONTROL))
            continue;
        if (t->wpm_strip && (f & TF_MARK))
            continue;
        jlm_tok_sbuf_cpt(&w, t->wpm_lower ? jlm_tok_tolower(c) : c);
        if (single) {
            wpm_word(t, w.p, w.n, out);
            w.n = 3;
        }
    }
    int rc = (cp.oom || w.oom || out->oom) ? JLM_ENOMEM : JLM_OK;
    free(cp.p);
    free(w.p);
    return rc;
}

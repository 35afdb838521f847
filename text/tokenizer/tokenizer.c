/* tokenizer.c - jlm_tok: building the maps and caches from a jlm_vocab, the
 * special-token partition, encode/decode and the streaming detokenizer.
 * The models live in tok_model.c, the pre-tokenizer in tok_pre.c and
 * tok_regex.c. Behaviour follows llama.cpp's llama_vocab::impl (tokenize,
 * tokenizer_st_partition, token_to_piece, detokenize).
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer/tokenizer_int.h"

/* ================================================================ hash maps */
static uint64_t fnv1a(const char *s, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h;
}
#define FNV_SEED 0xcbf29ce484222325ull

static uint64_t pair_hash(const char *l, size_t ln, const char *r, size_t rn)
{
    uint64_t h = fnv1a(l, ln, FNV_SEED);
    h = (h ^ 0xff) * 0x100000001b3ull;   /* separator: ("ab","c") != ("a","bc") */
    return fnv1a(r, rn, h ^ ln);
}

static int map_init(tok_map *m, uint32_t n)
{
    uint32_t cap = 16;
    while (cap < 2 * (uint64_t)n && cap < (1u << 31))
        cap *= 2;
    m->slot = malloc(cap * sizeof(int32_t));
    if (!m->slot)
        return JLM_ENOMEM;
    memset(m->slot, 0xFF, cap * sizeof(int32_t));
    m->mask = cap - 1;
    return JLM_OK;
}

int32_t jlm_tok_lookup(const jlm_tok *t, const char *s, size_t n)
{
    const jlm_str *tk = t->v->tokens;
    for (uint64_t i = fnv1a(s, n, FNV_SEED) & t->tokmap.mask;; i = (i + 1) & t->tokmap.mask) {
        int32_t id = t->tokmap.slot[i];
        if (id < 0 || (tk[id].len == n && memcmp(tk[id].s, s, n) == 0))
            return id;
    }
}

int32_t jlm_tok_merge_rank(const jlm_tok *t, const char *l, size_t ln, const char *r, size_t rn)
{
    if (!t->mergemap.slot)
        return -1;
    const jlm_str *mg = t->v->merges;
    for (uint64_t i = pair_hash(l, ln, r, rn) & t->mergemap.mask;; i = (i + 1) & t->mergemap.mask) {
        int32_t k = t->mergemap.slot[i];
        if (k < 0)
            return -1;
        const jlm_str *a = &mg[2 * (size_t)k], *b = &mg[2 * (size_t)k + 1];
        if (a->len == ln && b->len == rn && !memcmp(a->s, l, ln) && !memcmp(b->s, r, rn))
            return k;
    }
}

/* Token texts -> ids; a duplicate text is refused (invariant 3). */
static int build_tokmap(jlm_tok *t, jlm_err *err)
{
    const jlm_vocab *v = t->v;
    if (map_init(&t->tokmap, v->n_tokens))
        return jlm_errf(err, JLM_ENOMEM, "tokenizer: out of memory for %u tokens", v->n_tokens);
    for (uint32_t id = 0; id < v->n_tokens; id++) {
        const jlm_str *s = &v->tokens[id];
        if (!s->s && s->len)
            return jlm_errf(err, JLM_EFORMAT, "vocab: token %u has no text", id);
        int32_t found = jlm_tok_lookup(t, s->s ? s->s : "", s->len);
        if (found >= 0)
            return jlm_errf(err, JLM_EFORMAT, "vocab: token %u duplicates the text of token %d", id, found);
        uint64_t i = fnv1a(s->s ? s->s : "", s->len, FNV_SEED) & t->tokmap.mask;
        while (t->tokmap.slot[i] >= 0)
            i = (i + 1) & t->tokmap.mask;
        t->tokmap.slot[i] = (int32_t)id;
        if (s->len > t->max_token_len)
            t->max_token_len = s->len;
    }
    return JLM_OK;
}

/* (left, right) -> the first merge index holding it, as bpe_ranks.emplace. */
static int build_mergemap(jlm_tok *t, jlm_err *err)
{
    const jlm_vocab *v = t->v;
    if (!v->n_merges)
        return JLM_OK;
    if (v->n_merges > INT32_MAX / 2 || map_init(&t->mergemap, v->n_merges))
        return jlm_errf(err, JLM_ENOMEM, "tokenizer: out of memory for %u merges", v->n_merges);
    for (uint32_t k = 0; k < v->n_merges; k++) {
        const jlm_str *a = &v->merges[2 * (size_t)k], *b = &v->merges[2 * (size_t)k + 1];
        if ((!a->s && a->len) || (!b->s && b->len))
            return jlm_errf(err, JLM_EFORMAT, "vocab: merge %u has no text", k);
        if (jlm_tok_merge_rank(t, a->s, a->len, b->s, b->len) >= 0)
            continue;
        uint64_t i = pair_hash(a->s, a->len, b->s, b->len) & t->mergemap.mask;
        while (t->mergemap.slot[i] >= 0)
            i = (i + 1) & t->mergemap.mask;
        t->mergemap.slot[i] = (int32_t)k;
    }
    return JLM_OK;
}

/* ================================================================ pieces */
static int hex2(const char *s, size_t n, uint8_t *out)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return 0;
    unsigned v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        v = v * 16 + (unsigned)(c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : c >= 'a' && c <= 'f' ? c - 'a' + 10 : 99);
    }
    if (v > 255)
        return 0;
    *out = (uint8_t)v;
    return 1;
}

/* llama_decode_text: each code point back to its byte; an unmapped one
 * becomes "[UNK_BYTE_0x<hex>" + text + "]" exactly as llama.cpp writes it. */
static void decode_bytelevel(const jlm_str *s, tok_sbuf *b)
{
    tok_cpts cp = {0};
    jlm_tok_cpts_from_utf8(s->s, s->len, &cp);
    for (size_t i = 0; i < cp.n; i++) {
        int byte = jlm_tok_cpt_to_byte(cp.p[i]);
        if (byte >= 0) {
            uint8_t c = (uint8_t)byte;
            jlm_tok_sbuf_put(b, &c, 1);
            continue;
        }
        tok_sbuf u = {0};
        jlm_tok_sbuf_cpt(&u, cp.p[i]);
        jlm_tok_sbuf_put(b, "[UNK_BYTE_0x", 12);
        for (size_t j = 0; j < u.n; j++) {
            char hx[3];
            snprintf(hx, sizeof hx, "%02x", (uint8_t)u.p[j]);
            jlm_tok_sbuf_put(b, hx, 2);
        }
        jlm_tok_sbuf_put(b, s->s, s->len);
        jlm_tok_sbuf_put(b, "]", 1);
        if (u.oom)
            b->oom = 1;
        free(u.p);
    }
    if (cp.oom)
        b->oom = 1;
    free(cp.p);
}

/* token_to_piece(special = true) for one token. */
static void render_piece(const jlm_tok *t, uint32_t id, tok_sbuf *b)
{
    const jlm_str *s = &t->v->tokens[id];
    uint8_t k = t->kind[id], byte;
    switch (k) {
    case JLM_TOK_CONTROL: case JLM_TOK_UNKNOWN: case JLM_TOK_USER:
        jlm_tok_sbuf_put(b, s->s, s->len);
        return;
    case JLM_TOK_BYTE:
        if (t->v->kind != JLM_VOCAB_WPM && hex2(s->s, s->len, &byte))
            jlm_tok_sbuf_put(b, &byte, 1);
        else
            jlm_tok_sbuf_put(b, s->s, s->len);
        return;
    case JLM_TOK_NORMAL:
        if (t->v->kind == JLM_VOCAB_BPE && t->byte_level) {
            decode_bytelevel(s, b);
            return;
        }
        for (size_t i = 0; i < s->len;) {      /* U+2581 -> ' ' */
            if (s->len - i >= 3 && !memcmp(s->s + i, "\xe2\x96\x81", 3)) {
                jlm_tok_sbuf_put(b, " ", 1);
                i += 3;
            } else {
                jlm_tok_sbuf_put(b, s->s + i, 1);
                i++;
            }
        }
        return;
    default:                                   /* unused, undefined: nothing */
        return;
    }
}

static int build_pieces(jlm_tok *t, jlm_err *err)
{
    tok_sbuf b = {0};
    t->piece_off = malloc(((size_t)t->n_tokens + 1) * sizeof(uint64_t));
    if (!t->piece_off)
        return jlm_errf(err, JLM_ENOMEM, "tokenizer: out of memory for pieces");
    for (uint32_t id = 0; id < t->n_tokens; id++) {
        t->piece_off[id] = b.n;
        render_piece(t, id, &b);
        if (b.n - t->piece_off[id] > t->max_piece_len)
            t->max_piece_len = b.n - t->piece_off[id];
        jlm_tok_sbuf_put(&b, "", 1);            /* NUL separator */
    }
    t->piece_off[t->n_tokens] = b.n;
    t->pieces = b.p;
    if (b.oom)
        return jlm_errf(err, JLM_ENOMEM, "tokenizer: out of memory for pieces");
    return JLM_OK;
}

/* ================================================================ create / destroy */
static int check_ids(const jlm_vocab *v, jlm_err *err)
{
    const int32_t sp[6] = {v->bos, v->eos, v->unk, v->pad, v->sep, v->mask};
    static const char *nm[6] = {"BOS", "EOS", "Unk", "Pad", "Sep", "Mask"};
    for (int i = 0; i < 6; i++)
        if (sp[i] < -1 || (sp[i] >= 0 && (uint32_t)sp[i] >= v->n_tokens))
            return jlm_errf(err, JLM_EFORMAT, "vocab: %s id %d outside [-1, %u)", nm[i], sp[i], v->n_tokens);
    for (uint32_t i = 0; i < v->n_added; i++)
        if (v->added[i].id < 0 || (uint32_t)v->added[i].id >= v->n_tokens || (!v->added[i].content.s && v->added[i].content.len))
            return jlm_errf(err, JLM_EFORMAT, "vocab: added token %u: id %d outside [0, %u)", i, v->added[i].id, v->n_tokens);
    if (v->n_scores && v->n_scores != v->n_tokens)
        return jlm_errf(err, JLM_EFORMAT, "vocab: %u scores for %u tokens", v->n_scores, v->n_tokens);
    if (v->n_token_kinds && v->n_token_kinds != v->n_tokens)
        return jlm_errf(err, JLM_EFORMAT, "vocab: %u token kinds for %u tokens", v->n_token_kinds, v->n_tokens);
    int32_t end_id = v->kind == JLM_VOCAB_WPM ? v->sep : v->eos;
    if (v->add_bos && v->bos < 0)
        return jlm_errf(err, JLM_EFORMAT, "vocab: AddBOS is set but there is no BOS id");
    if (v->add_eos && end_id < 0)
        return jlm_errf(err, JLM_EFORMAT, "vocab: AddEOS is set but there is no %s id",
                        v->kind == JLM_VOCAB_WPM ? "Sep" : "EOS");
    return JLM_OK;
}

static int cmp_special(const void *a, const void *b)
{
    const jlm_added_token *x = *(const jlm_added_token *const *)a, *y = *(const jlm_added_token *const *)b;
    if (x->content.len != y->content.len)
        return x->content.len > y->content.len ? -1 : 1;
    return x < y ? -1 : x > y;   /* stable: record order */
}

static int build_specials(jlm_tok *t, jlm_err *err)
{
    const jlm_vocab *v = t->v;
    t->special = malloc((v->n_added ? v->n_added : 1) * sizeof(*t->special));
    if (!t->special)
        return jlm_errf(err, JLM_ENOMEM, "tokenizer: out of memory");
    for (uint32_t i = 0; i < v->n_added; i++)
        if (v->added[i].content.len)
            t->special[t->n_special++] = &v->added[i];
    qsort(t->special, t->n_special, sizeof(*t->special), cmp_special);
    return JLM_OK;
}

static void build_bytes(jlm_tok *t)
{
    for (int b = 0; b < 256; b++) {
        char hx[8], one = (char)b;
        snprintf(hx, sizeof hx, "<0x%02X>", b);
        int32_t id = jlm_tok_lookup(t, hx, 6);
        t->byte_tok[b] = id >= 0 ? id : jlm_tok_lookup(t, &one, 1);
    }
}

int jlm_tok_create(const jlm_vocab *v, jlm_tok **out, jlm_err *err)
{
    if (!v || !out)
        return jlm_errf(err, JLM_EINVAL, "jlm_tok_create: NULL argument");
    if (v->kind == JLM_VOCAB_NONE)
        return jlm_errf(err, JLM_EUNSUPPORTED, "the model has no tokenizer: the tokenizer files are missing from its "
                        "source (a Hugging Face folder needs tokenizer.json and tokenizer_config.json)");
    if (v->kind != JLM_VOCAB_SPM && v->kind != JLM_VOCAB_BPE && v->kind != JLM_VOCAB_WPM)
        return jlm_errf(err, JLM_EUNSUPPORTED, "vocab: kind %u has no tokenizer here (1 SPM, 2 BPE, 3 WPM)", v->kind);
    if (!v->n_tokens || v->n_tokens > INT32_MAX / 2)
        return jlm_errf(err, JLM_EFORMAT, "vocab: %u tokens", v->n_tokens);
    int rc = check_ids(v, err);
    if (rc)
        return rc;
    jlm_tok *t = calloc(1, sizeof *t);
    if (!t)
        return jlm_errf(err, JLM_ENOMEM, "tokenizer: out of memory");
    t->v = v;
    t->n_tokens = v->n_tokens;
    t->kind = malloc(v->n_tokens);
    if (!t->kind) {
        free(t);
        return jlm_errf(err, JLM_ENOMEM, "tokenizer: out of memory");
    }
    for (uint32_t i = 0; i < v->n_tokens; i++)
        t->kind[i] = v->n_token_kinds ? v->token_kinds[i] : JLM_TOK_NORMAL;
    if ((rc = build_tokmap(t, err)) || (rc = build_mergemap(t, err)) || (rc = jlm_tok_pre_build(t, err)) ||
        (rc = build_pieces(t, err)) || (rc = build_specials(t, err))) {
        jlm_tok_destroy(t);
        return rc;
    }
    build_bytes(t);
    *out = t;
    return JLM_OK;
}

void jlm_tok_destroy(jlm_tok *t)
{
    if (!t)
        return;
    jlm_tok_pre_free(t);
    free(t->kind);
    free(t->tokmap.slot);
    free(t->mergemap.slot);
    free(t->pieces);
    free(t->piece_off);
    free(t->special);
    free(t);
}

uint32_t jlm_tok_n_tokens(const jlm_tok *t) { return t->n_tokens; }
const jlm_vocab *jlm_tok_vocab(const jlm_tok *t) { return t->v; }

int jlm_tok_is_eog(const jlm_tok *t, int32_t id)
{
    const jlm_vocab *v = t->v;
    if (id == v->eos)
        return 1;
    for (uint32_t i = 0; i < v->n_stop; i++)
        if (v->stop[i] == id)
            return 1;
    return 0;
}
size_t jlm_tok_max_piece_len(const jlm_tok *t) { return t->max_piece_len; }

/* ================================================================ encode */
typedef struct frag { int32_t id; size_t off, len; } frag;   /* id -1: raw text */
typedef struct frags { frag *p; size_t n, cap; int oom; } frags;

static void frag_push(frags *f, frag x)
{
    if (f->oom)
        return;
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 8;
        frag *np = realloc(f->p, cap * sizeof(frag));
        if (!np) {
            f->oom = 1;
            return;
        }
        f->p = np;
        f->cap = cap;
    }
    f->p[f->n++] = x;
}

/* One raw fragment against one added token (tokenizer_st_partition). */
static void split_on(const char *text, frag in, const jlm_added_token *a, frags *out)
{
    size_t base = in.off, blen = in.len, cl = a->content.len;
    for (;;) {
        const char *m = blen >= cl ? memmem(text + base, blen, a->content.s, cl) : NULL;
        if (!m) {
            frag_push(out, (frag){-1, base, blen});
            return;
        }
        size_t at = (size_t)(m - text);
        if (at > base) {
            size_t ll = at - base;
            while (a->lstrip && ll > 0 && isspace((unsigned char)text[base + ll - 1]))
                ll--;
            if (ll)
                frag_push(out, (frag){-1, base, ll});
        }
        frag_push(out, (frag){a->id, 0, 0});
        size_t roff = at + cl, rlen = base + blen - roff;
        while (a->rstrip && rlen > 0 && isspace((unsigned char)text[roff])) {
            roff++;
            rlen--;
        }
        if (!rlen)
            return;
        base = roff;
        blen = rlen;
    }
}

static int partition(const jlm_tok *t, const char *text, size_t len, int parse_special, frags *f)
{
    frags g = {0};
    if (len)
        frag_push(f, (frag){-1, 0, len});
    for (uint32_t s = 0; s < t->n_special && !f->oom; s++) {
        const jlm_added_token *a = t->special[s];
        if (a->special && !parse_special)
            continue;
        g.n = 0;
        for (size_t i = 0; i < f->n; i++) {
            if (f->p[i].id >= 0)
                frag_push(&g, f->p[i]);
            else
                split_on(text, f->p[i], a, &g);
        }
        frags tmp = *f;
        *f = g;
        g = tmp;
        if (g.oom)
            f->oom = 1;
    }
    free(g.p);
    return f->oom ? JLM_ENOMEM : JLM_OK;
}

/* SPM: an optional space before a fragment that follows a special token (or
 * starts the text), every ' ' escaped to U+2581. */
static int spm_fragment(const jlm_tok *t, const char *s, size_t n, int prefix, tok_ids *out)
{
    tok_sbuf b = {0};
    if (prefix)
        jlm_tok_sbuf_put(&b, "\xe2\x96\x81", 3);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ')
            jlm_tok_sbuf_put(&b, "\xe2\x96\x81", 3);
        else
            jlm_tok_sbuf_put(&b, s + i, 1);
    }
    int rc = b.oom ? JLM_ENOMEM : jlm_tok_spm(t, b.p ? b.p : "", b.n, out);
    free(b.p);
    return rc;
}

int jlm_tok_encode(const jlm_tok *t, const char *text, size_t len, int add_special,
                   int parse_special, int32_t **ids, size_t *n, jlm_err *err)
{
    if (!t || !ids || !n || (!text && len))
        return jlm_errf(err, JLM_EINVAL, "jlm_tok_encode: NULL argument");
    const jlm_vocab *v = t->v;
    frags f = {0};
    tok_ids out = {0};
    int rc = partition(t, text, len, parse_special, &f);
    if (add_special && v->add_bos)
        jlm_tok_ids_push(&out, v->bos);
    int prev_special = 1;
    for (size_t i = 0; i < f.n && !rc; i++) {
        const frag *fr = &f.p[i];
        if (fr->id >= 0) {
            jlm_tok_ids_push(&out, fr->id);
            prev_special = 1;
            continue;
        }
        if (v->kind == JLM_VOCAB_SPM)
            rc = spm_fragment(t, text + fr->off, fr->len, v->add_space_prefix && prev_special, &out);
        else if (v->kind == JLM_VOCAB_BPE)
            rc = jlm_tok_bpe(t, text + fr->off, fr->len, &out);
        else
            rc = jlm_tok_wpm(t, text + fr->off, fr->len, &out);
        prev_special = 0;
    }
    if (add_special && v->add_eos)
        jlm_tok_ids_push(&out, v->kind == JLM_VOCAB_WPM ? v->sep : v->eos);
    free(f.p);
    if (!rc && out.oom)
        rc = JLM_ENOMEM;
    if (rc) {
        free(out.p);
        return jlm_errf(err, rc, "tokenizer: out of memory encoding %zu bytes", len);
    }
    if (!out.n) {
        free(out.p);
        out.p = NULL;
    }
    *ids = out.p;
    *n = out.n;
    return JLM_OK;
}

/* ================================================================ pieces, decode */
static void piece_of(const jlm_tok *t, int32_t id, int special, const char **p, size_t *n)
{
    uint8_t k = t->kind[id];
    *p = t->pieces + t->piece_off[id];
    *n = (size_t)(t->piece_off[id + 1] - t->piece_off[id] - 1);
    if (!special && (k == JLM_TOK_CONTROL || k == JLM_TOK_UNKNOWN))
        *n = 0;
}

int jlm_tok_piece(const jlm_tok *t, int32_t id, int special, const char **piece, size_t *len, jlm_err *err)
{
    if (id < 0 || (uint32_t)id >= t->n_tokens)
        return jlm_errf(err, JLM_ERANGE, "token id %d outside [0, %u)", id, t->n_tokens);
    piece_of(t, id, special, piece, len);
    return JLM_OK;
}

int jlm_tok_decode(const jlm_tok *t, const int32_t *ids, size_t n, int special,
                   char **text, size_t *len, jlm_err *err)
{
    tok_sbuf b = {0};
    jlm_tok_sbuf_put(&b, "", 0);
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t pl;
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->n_tokens) {
            free(b.p);
            return jlm_errf(err, JLM_ERANGE, "decode: id %d at position %zu outside [0, %u)", ids[i], i, t->n_tokens);
        }
        piece_of(t, ids[i], special, &p, &pl);
        if (i == 0 && t->v->add_space_prefix && pl && p[0] == ' ') {
            p++;
            pl--;
        }
        jlm_tok_sbuf_put(&b, p, pl);
    }
    if (b.oom) {
        free(b.p);
        return jlm_errf(err, JLM_ENOMEM, "decode: out of memory");
    }
    *text = b.p;
    *len = b.n;
    return JLM_OK;
}

/* ================================================================ streaming */
void jlm_tok_stream_init(jlm_tok_stream *s, const jlm_tok *t, int special, int strip_leading_space)
{
    memset(s, 0, sizeof *s);
    s->tok = t;
    s->special = special != 0;
    s->strip_space = strip_leading_space != 0;
}

/* Start of an incomplete UTF-8 sequence at the end of b[0, n), or n if none:
 * a lead byte within the last 3 bytes followed only by continuation bytes,
 * fewer than it announces. */
static size_t incomplete_tail(const uint8_t *b, size_t n)
{
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        uint8_t c = b[n - back];
        if ((c & 0xC0) == 0x80)
            continue;
        size_t need = c >= 0xF8 ? 0 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? n - back : n;
    }
    return n;
}

int jlm_tok_stream_feed(jlm_tok_stream *s, int32_t id, char *out, size_t cap, size_t *n_out, jlm_err *err)
{
    const char *p;
    size_t pl;
    int rc = jlm_tok_piece(s->tok, id, s->special, &p, &pl, err);
    if (rc)
        return rc;
    if (s->strip_space && pl && p[0] == ' ') {
        p++;
        pl--;
    }
    size_t total = s->n_held + pl;
    if (cap < total)
        return jlm_errf(err, JLM_ERANGE, "stream: buffer of %zu bytes, need %zu", cap, total);
    memmove(out + s->n_held, p, pl);
    memcpy(out, s->held, s->n_held);
    size_t keep = incomplete_tail((const uint8_t *)out, total);
    s->n_held = (uint8_t)(total - keep);
    memcpy(s->held, out + keep, s->n_held);
    s->strip_space = 0;
    *n_out = keep;
    return JLM_OK;
}

size_t jlm_tok_stream_flush(jlm_tok_stream *s, char out[4])
{
    size_t n = s->n_held;
    memcpy(out, s->held, n);
    s->n_held = 0;
    return n;
}

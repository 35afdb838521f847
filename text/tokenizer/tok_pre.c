/* tok_pre.c - Unicode helpers and the pre-tokenizer: the record's PreOp list
 * compiled into stages and run over a text, as llama.cpp's
 * unicode_regex_split runs its regex list (docs/tokenizer.md, "Stages").
 *
 * Each stage refines a piece list: it splits every piece on its own (a match
 * never spans two pieces; lookahead and '$' see the piece end), and both the
 * matches and the gaps between them become pieces. The hand-written Split
 * matcher is llama.cpp's unicode_regex_split_custom_gpt2 / _llama3, with the
 * variants selected by flags instead of by pattern text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "text/tokenizer/tokenizer_int.h"

/* ================================================================ vectors */
#define VEC_PUSH(v, x) do {                                                     \
        if ((v)->oom) break;                                                    \
        if ((v)->n == (v)->cap) {                                               \
            size_t cap_ = (v)->cap ? 2 * (v)->cap : 16;                         \
            void *np_ = realloc((v)->p, cap_ * sizeof(*(v)->p));                \
            if (!np_) { (v)->oom = 1; break; }                                  \
            (v)->p = np_; (v)->cap = cap_;                                      \
        }                                                                       \
        (v)->p[(v)->n++] = (x);                                                 \
    } while (0)

void jlm_tok_ids_push(tok_ids *v, int32_t x)    { VEC_PUSH(v, x); }
void jlm_tok_lens_push(tok_lens *v, size_t x)   { VEC_PUSH(v, x); }
void jlm_tok_cpts_push(tok_cpts *v, uint32_t x) { VEC_PUSH(v, x); }

void jlm_tok_sbuf_put(tok_sbuf *b, const void *p, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}

/* unicode_cpt_to_utf8; a code point above U+10FFFF (never produced) is dropped. */
void jlm_tok_sbuf_cpt(tok_sbuf *b, uint32_t cp)
{
    uint8_t u[4];
    size_t n;
    if (cp < 0x80) { u[0] = (uint8_t)cp; n = 1; }
    else if (cp < 0x800) { u[0] = 0xC0 | (cp >> 6); u[1] = 0x80 | (cp & 0x3F); n = 2; }
    else if (cp < 0x10000) {
        u[0] = 0xE0 | (cp >> 12); u[1] = 0x80 | ((cp >> 6) & 0x3F); u[2] = 0x80 | (cp & 0x3F); n = 3;
    } else if (cp <= 0x10FFFF) {
        u[0] = 0xF0 | (cp >> 18); u[1] = 0x80 | ((cp >> 12) & 0x3F);
        u[2] = 0x80 | ((cp >> 6) & 0x3F); u[3] = 0x80 | (cp & 0x3F); n = 4;
    } else {
        return;
    }
    jlm_tok_sbuf_put(b, u, n);
}

/* ================================================================ unicode */
/* White_Space, as llama.cpp's unicode_set_whitespace. */
static int is_white(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

uint32_t jlm_tok_flags(uint32_t cp)
{
    if (cp > 0x10FFFF)
        return TF_UNDEF;
    uint32_t f;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
        f = TF_LETTER; break;
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
        f = TF_MARK; break;
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
        f = TF_NUMBER; break;
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE: case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
        f = TF_PUNCT; break;
    case UTF8PROC_CATEGORY_SM: case UTF8PROC_CATEGORY_SC: case UTF8PROC_CATEGORY_SK:
    case UTF8PROC_CATEGORY_SO:
        f = TF_SYMBOL; break;
    case UTF8PROC_CATEGORY_ZS: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP:
        f = TF_SEP; break;
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
        f = TF_CONTROL; break;
    default:
        f = TF_UNDEF; break;
    }
    return is_white(cp) ? f | TF_WS : f;
}

uint32_t jlm_tok_tolower(uint32_t cp)
{
    return cp > 0x10FFFF ? cp : (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
}

uint32_t jlm_tok_nfd_first(uint32_t cp)
{
    if (cp < 0xC0 || cp > 0x10FFFF)
        return cp;
    utf8proc_int32_t d[32];
    int bc = 0;
    utf8proc_ssize_t n = utf8proc_decompose_char((utf8proc_int32_t)cp, d, 32, UTF8PROC_DECOMPOSE, &bc);
    return (n >= 1 && n <= 32) ? (uint32_t)d[0] : cp;
}

size_t jlm_tok_utf8_len(uint8_t lead)
{
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[lead >> 4];
}

/* unicode_cpt_from_utf8 + unicode_cpts_from_utf8: structure checks only (no
 * overlong/surrogate checks), a bad sequence gives U+FFFD and skips one byte. */
void jlm_tok_cpts_from_utf8(const char *str, size_t n, tok_cpts *out)
{
    const uint8_t *s = (const uint8_t *)str;
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        uint32_t cp;
        size_t len;
        if (!(c & 0x80)) { cp = c; len = 1; }
        else if (!(c & 0x40)) { cp = 0xFFFD; len = 0; }
        else if (!(c & 0x20)) { cp = c & 0x1F; len = 2; }
        else if (!(c & 0x10)) { cp = c & 0x0F; len = 3; }
        else if (!(c & 0x08)) { cp = c & 0x07; len = 4; }
        else { cp = 0xFFFD; len = 0; }
        if (len > 1) {
            if (i + len > n) {
                len = 0;
            } else {
                for (size_t j = 1; j < len; j++) {
                    if ((s[i + j] & 0xC0) != 0x80) { len = 0; break; }
                    cp = (cp << 6) | (s[i + j] & 0x3F);
                }
            }
        }
        if (len == 0) {
            jlm_tok_cpts_push(out, 0xFFFD);
            i++;
        } else {
            jlm_tok_cpts_push(out, cp);
            i += len;
        }
    }
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * other 68 (0x00-0x20, 0x7F-0xA0, 0xAD) to U+0100.. in byte order. */
uint32_t jlm_tok_byte_to_cpt(uint8_t b)
{
    if (b <= 0x20)
        return 256u + b;
    if (b >= 0x7F && b <= 0xA0)
        return 256u + 33 + (b - 0x7Fu);
    if (b == 0xAD)
        return 256u + 67;
    return b;
}

int jlm_tok_cpt_to_byte(uint32_t cp)
{
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp < 256 || cp >= 256 + 68)
        return -1;
    uint32_t m = cp - 256;
    return m < 33 ? (int)m : m < 67 ? (int)(0x7F + m - 33) : 0xAD;
}

/* ================================================================ Split: the hand-written matcher */
/* One piece [ini, end) of cpts. Flags (docs/tokenizer.md, kind 1):
 *   add_prefix_space=1  GPT-2 shape:  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   add_prefix_space=0  LLaMA-3 shape: (contractions)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,G}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   contractions, case_fold (contractions match case-insensitively), digit_group G (0 = unbounded). */
typedef struct split_ctx {
    const uint32_t *cp;
    size_t ini, end, prev;
    tok_lens *out;
} split_ctx;

static uint32_t sc_cpt(const split_ctx *c, size_t pos) { return pos >= c->ini && pos < c->end ? c->cp[pos] : 0xFFFFFFFFu; }
static uint32_t sc_flags(const split_ctx *c, size_t pos) { return pos >= c->ini && pos < c->end ? jlm_tok_flags(c->cp[pos]) : 0; }

static size_t sc_add(split_ctx *c, size_t end)
{
    size_t len = end - c->prev;
    if (len)
        jlm_tok_lens_push(c->out, len);
    c->prev = end;
    return len;
}

/* 's 't 'm 'd / 're 've 'll at pos: returns the match length or 0. */
static size_t contraction(const split_ctx *c, size_t pos, int fold)
{
    if (sc_cpt(c, pos) != '\'' || pos + 1 >= c->end)
        return 0;
    uint32_t a = sc_cpt(c, pos + 1);
    if (fold)
        a = jlm_tok_tolower(a);
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if (pos + 2 >= c->end)
        return 0;
    uint32_t b = sc_cpt(c, pos + 2);
    if (fold)
        b = jlm_tok_tolower(b);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

/* Whitespace tail shared by both shapes; returns the new pos. */
static size_t split_ws(split_ctx *c, size_t pos, int newline_rule)
{
    size_t nws = 0, last_nl = 0;
    while (sc_flags(c, pos + nws) & TF_WS) {
        uint32_t w = sc_cpt(c, pos + nws);
        if (w == '\r' || w == '\n')
            last_nl = pos + nws + 1;
        nws++;
    }
    if (newline_rule && last_nl > 0)                                 /* \s*[\r\n]+ */
        pos = last_nl;
    else if (nws > 1 && sc_cpt(c, pos + nws) != 0xFFFFFFFFu)         /* \s+(?!\S) */
        pos += nws - 1;
    else if (nws > 0)                                                /* \s+ */
        pos += nws;
    else
        pos++;                                                       /* no match: one char */
    sc_add(c, pos);
    return pos;
}

static void split_gpt2(split_ctx *c, const jlm_preop *op)
{
    for (size_t pos = c->ini; pos < c->end;) {
        uint32_t cpt = sc_cpt(c, pos), fl = sc_flags(c, pos);
        size_t k = op->contractions ? contraction(c, pos, op->case_fold) : 0;
        if (k) {
            pos += sc_add(c, pos + k);
            continue;
        }
        uint32_t f2 = cpt == ' ' ? sc_flags(c, pos + 1) : fl;
        uint32_t grp = (f2 & TF_LETTER) ? TF_LETTER : (f2 & TF_NUMBER) ? TF_NUMBER : 0;
        if (grp) {                                                   /* ' ?\p{L}+' and ' ?\p{N}+' */
            pos += cpt == ' ';
            size_t ini = pos;
            while (sc_flags(c, pos) & grp) {
                pos++;
                if (grp == TF_NUMBER && op->digit_group && pos - ini >= op->digit_group)
                    break;
            }
            sc_add(c, pos);
            continue;
        }
        if (!(f2 & (TF_WS | TF_LETTER | TF_NUMBER)) && f2) {         /* ' ?[^\s\p{L}\p{N}]+' */
            pos += cpt == ' ';
            while (!(f2 & (TF_WS | TF_LETTER | TF_NUMBER)) && f2)
                f2 = sc_flags(c, ++pos);
            sc_add(c, pos);
            continue;
        }
        pos = split_ws(c, pos, 0);
    }
}

static void split_llama3(split_ctx *c, const jlm_preop *op)
{
    for (size_t pos = c->ini; pos < c->end;) {
        uint32_t cpt = sc_cpt(c, pos), fl = sc_flags(c, pos);
        size_t k = op->contractions ? contraction(c, pos, op->case_fold) : 0;
        if (k) {
            pos += sc_add(c, pos + k);
            continue;
        }
        if (!(cpt == '\r' || cpt == '\n' || (fl & TF_NUMBER)) &&     /* [^\r\n\p{L}\p{N}]?\p{L}+ */
            ((fl & TF_LETTER) || (sc_flags(c, pos + 1) & TF_LETTER))) {
            pos++;
            while (sc_flags(c, pos) & TF_LETTER)
                pos++;
            sc_add(c, pos);
            continue;
        }
        if (fl & TF_NUMBER) {                                        /* \p{N}{1,G} */
            size_t ini = pos;
            while (sc_flags(c, pos) & TF_NUMBER) {
                if (++pos - ini >= op->digit_group && op->digit_group) {
                    sc_add(c, pos);
                    ini = pos;
                }
            }
            sc_add(c, pos);
            continue;
        }
        uint32_t f2 = cpt == ' ' ? sc_flags(c, pos + 1) : fl;        /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
        if (!(f2 & (TF_WS | TF_LETTER | TF_NUMBER)) && fl) {
            pos += cpt == ' ';
            while (!(f2 & (TF_WS | TF_LETTER | TF_NUMBER)) && f2)
                f2 = sc_flags(c, ++pos);
            uint32_t w = sc_cpt(c, pos);
            while (w == '\r' || w == '\n')
                w = sc_cpt(c, ++pos);
            sc_add(c, pos);
            continue;
        }
        pos = split_ws(c, pos, 1);
    }
}

static int split_hand(const jlm_preop *op, const uint32_t *cpts, const tok_lens *in, tok_lens *out)
{
    size_t start = 0;
    for (size_t p = 0; p < in->n; p++) {
        split_ctx c = {cpts, start, start + in->p[p], start, out};
        if (op->add_prefix_space)
            split_gpt2(&c, op);
        else
            split_llama3(&c, op);
        start = c.end;
    }
    return out->oom ? JLM_ENOMEM : JLM_OK;
}

/* ================================================================ stage table */
/* The fixed pattern each regex-backed kind stands for (llama.cpp's regex text). */
static const char *kind_pattern(const jlm_preop *op, char *buf, size_t cap)
{
    switch (op->kind) {
    case 3: return op->individual ? "\\p{N}" : "\\p{N}+";                      /* Digits */
    case 4: return op->individual ? "[\\p{P}!-/:-@\\[-`{-~]"                    /* Punctuation */
                                  : "[\\p{P}\\$\\+<=>\\^~\\|`]+";
    case 6: return "[0-9][0-9][0-9]";                                          /* DigitTriples */
    case 7: return "[\\p{P}\\$\\+<=>\\^~\\|]+";                                /* PunctDefault */
    case 8:                                                                     /* DigitGroups */
        snprintf(buf, cap, "\\p{N}{1,%u}", op->digit_group ? op->digit_group : 3u);
        return buf;
    case 9: return "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+"; /* KanaHanRuns */
    default: return NULL;
    }
}

int jlm_tok_pre_build(jlm_tok *t, jlm_err *err)
{
    const jlm_vocab *v = t->v;
    t->wpm_lower = t->wpm_strip = t->nfc = 0;
    if (!v->n_preops)
        return JLM_OK;
    t->stages = calloc(v->n_preops, sizeof(tok_stage));
    if (!t->stages)
        return jlm_errf(err, JLM_ENOMEM, "tokenizer: out of memory");
    t->n_stages = v->n_preops;
    for (uint32_t i = 0; i < v->n_preops; i++) {
        const jlm_preop *op = &v->preops[i];
        tok_stage *st = &t->stages[i];
        char what[64], buf[32];
        snprintf(what, sizeof what, "vocab PreOp %u (kind %u)", i, op->kind);
        st->op = op;
        if (op->case_runs || op->suffix_contract || op->punct_slash || op->han_runs ||
            (v->n_punct_no_newline > i && v->punct_no_newline[i]) || op->letter_marks > 1)
            return jlm_errf(err, JLM_EUNSUPPORTED, "%s: CaseRuns/SuffixContract/PunctSlash/HanRuns/"
                            "PunctNoNewline are not implemented (docs/tokenizer.md)", what);
        if (op->kind == 2) {
            t->byte_level = 1;
            if (op->use_regex)
                return jlm_errf(err, JLM_EUNSUPPORTED, "%s: ByteLevel with UseRegex; put a Split stage before it", what);
            continue;
        }
        if (op->kind == 5 && op->behavior.len) {
            /* the normaliser convention (docs/tokenizer.md section 1): only "nfc" */
            if (op->behavior.len != 3 || memcmp(op->behavior.s, "nfc", 3))
                return jlm_errf(err, JLM_EUNSUPPORTED, "%s: normaliser '%.*s' is not supported (nfc only)", what,
                                (int)(op->behavior.len > 40 ? 40 : op->behavior.len), op->behavior.s);
            t->nfc = 1;
            continue;
        }
        if (op->kind == 5) {
            t->wpm_lower = op->case_fold;
            t->wpm_strip = !op->letter_marks;
            continue;
        }
        const char *pat = NULL;
        size_t plen = 0;
        if (op->use_regex) {
            if (!op->behavior.s || !op->behavior.len)
                return jlm_errf(err, JLM_EFORMAT, "%s: UseRegex with an empty Behavior pattern", what);
            pat = op->behavior.s;
            plen = op->behavior.len;
        } else if (op->kind != 1) {
            pat = kind_pattern(op, buf, sizeof buf);
            if (!pat)
                return jlm_errf(err, JLM_EUNSUPPORTED, "%s: unknown PreOp kind", what);
            plen = strlen(pat);
        } else if (op->letter_marks) {
            return jlm_errf(err, JLM_EUNSUPPORTED, "%s: Split with LetterMarks needs a regex stage", what);
        }
        if (pat) {
            int rc = jlm_tok_rx_compile(pat, plen, what, &st->rx, err);
            if (rc)
                return rc;
        }
    }
    return JLM_OK;
}

void jlm_tok_pre_free(jlm_tok *t)
{
    for (uint32_t i = 0; i < t->n_stages; i++)
        jlm_tok_rx_free(t->stages[i].rx);
    free(t->stages);
    t->stages = NULL;
    t->n_stages = 0;
}

/* Unicode NFC of a code point sequence, in place: canonical decomposition of
 * each code point, canonical ordering of combining marks, then utf8proc's
 * canonical composition (what utf8proc_map with UTF8PROC_COMPOSE does, on
 * code points: the decoder's U+FFFD and out-of-range values pass through). */
static int nfc_cpts(tok_cpts *cp)
{
    size_t cap = cp->n * 4 + 16, n = 0;
    utf8proc_int32_t *d = malloc(cap * sizeof *d);
    if (!d)
        return JLM_ENOMEM;
    for (size_t i = 0; i < cp->n; i++) {
        int bc = 0;
        utf8proc_ssize_t k = -1;
        if (cp->p[i] <= 0x10FFFF && !(cp->p[i] >= 0xD800 && cp->p[i] <= 0xDFFF)) {
            if (cap - n < 32) {
                utf8proc_int32_t *nd = realloc(d, (cap *= 2) * sizeof *d);
                if (!nd) {
                    free(d);
                    return JLM_ENOMEM;
                }
                d = nd;
            }
            k = utf8proc_decompose_char((utf8proc_int32_t)cp->p[i], d + n, 32, UTF8PROC_DECOMPOSE, &bc);
        }
        if (k < 1 || k > 32) {   /* not a scalar value: kept, and it blocks composition */
            if (cap == n) {
                free(d);
                return JLM_ENOMEM;
            }
            d[n] = (utf8proc_int32_t)cp->p[i];
            k = 1;
        }
        n += (size_t)k;
    }
    /* canonical ordering: a stable sort of each run of non-starters by class */
    for (size_t i = 1; i < n; i++) {
        for (size_t j = i; j > 0; j--) {
            int a = d[j - 1] <= 0x10FFFF ? utf8proc_get_property(d[j - 1])->combining_class : 0;
            int b = d[j] <= 0x10FFFF ? utf8proc_get_property(d[j])->combining_class : 0;
            if (!a || !b || a <= b)
                break;
            utf8proc_int32_t x = d[j - 1];
            d[j - 1] = d[j];
            d[j] = x;
        }
    }
    utf8proc_ssize_t m = utf8proc_normalize_utf32(d, (utf8proc_ssize_t)n, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (m < 0 || (size_t)m > n) {
        free(d);
        return JLM_EINVAL;
    }
    cp->n = 0;
    for (utf8proc_ssize_t i = 0; i < m; i++)
        jlm_tok_cpts_push(cp, (uint32_t)d[i]);
    free(d);
    return cp->oom ? JLM_ENOMEM : JLM_OK;
}

/* Runs every splitting stage, then writes each piece as UTF-8 (byte-encoded
 * when a ByteLevel stage is present), as unicode_regex_split does. */
int jlm_tok_pre_split(const jlm_tok *t, const char *text, size_t len, tok_sbuf *words, tok_lens *lens)
{
    tok_cpts cp = {0};
    tok_lens a = {0}, b = {0};
    int rc = JLM_OK;
    jlm_tok_cpts_from_utf8(text, len, &cp);
    if (t->nfc && !cp.oom)
        rc = nfc_cpts(&cp);
    jlm_tok_lens_push(&a, cp.n);
    if (cp.oom || a.oom)
        rc = JLM_ENOMEM;
    for (uint32_t i = 0; i < t->n_stages && !rc; i++) {
        const tok_stage *st = &t->stages[i];
        if (st->op->kind == 2 || st->op->kind == 5)
            continue;
        b.n = 0;
        rc = st->rx ? jlm_tok_rx_split(st->rx, cp.p, &a, &b) : split_hand(st->op, cp.p, &a, &b);
        tok_lens tmp = a;
        a = b;
        b = tmp;
    }
    tok_sbuf piece = {0};
    size_t start = 0;
    for (size_t p = 0; p < a.n && !rc; p++) {
        if (!a.p[p])
            continue;
        piece.n = 0;
        for (size_t i = start; i < start + a.p[p]; i++)
            jlm_tok_sbuf_cpt(&piece, cp.p[i]);
        start += a.p[p];
        size_t before = words->n;
        if (t->byte_level) {
            for (size_t i = 0; i < piece.n; i++)
                jlm_tok_sbuf_cpt(words, jlm_tok_byte_to_cpt((uint8_t)piece.p[i]));
        } else {
            jlm_tok_sbuf_put(words, piece.p, piece.n);
        }
        jlm_tok_lens_push(lens, words->n - before);
        if (piece.oom || words->oom || lens->oom)
            rc = JLM_ENOMEM;
    }
    free(piece.p);
    free(cp.p);
    free(a.p);
    free(b.p);
    return rc;
}

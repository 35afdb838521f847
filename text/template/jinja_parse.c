/* jinja_parse.c - lexer and recursive-descent parser (Jinja2 3.1 grammar).
 *
 * Lexing follows jinja2.lexer with the Hugging Face settings: newlines are
 * normalised to "\n", one trailing newline is dropped, trim_blocks removes the
 * first "\n" after a block or comment tag, lstrip_blocks removes the blanks
 * before a block or comment tag that starts a line, "-" strips all whitespace
 * on that side and "+" disables lstrip/trim for that tag. End delimiters are
 * only recognised outside brackets (as jinja2's balancing stack does).
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "text/template/jinja_int.h"

/* ================================================================ tokens */
enum { T_DATA, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT,
       T_FLOAT, T_OP, T_EOF };

typedef struct tok { int t, line; const char *s; size_t n; jj_val v; } tok;

typedef struct lexer {
    jj_ctx     *C;
    const char *src;
    size_t      n, pos;
    int         line;
    tok        *toks;
    size_t      ntok, cap;
} lexer;

static const char *OPS[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~",
                            "<", ">", "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", ";", NULL};

static tok *push_tok(lexer *L, int t, int line)
{
    if (L->ntok == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        tok *nt = jlm_jj_alloc(L->C, cap * sizeof(tok));
        if (L->ntok) memcpy(nt, L->toks, L->ntok * sizeof(tok));
        L->toks = nt;
        L->cap = cap;
    }
    tok *k = &L->toks[L->ntok++];
    memset(k, 0, sizeof *k);
    k->t = t;
    k->line = line;
    return k;
}

static int count_nl(const char *s, size_t n)
{
    int c = 0;
    for (size_t i = 0; i < n; i++) c += s[i] == '\n';
    return c;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static size_t rstrip_len(const char *s, size_t n)
{
    while (n) {   /* Python str.rstrip(): also non-ASCII spaces */
        size_t k = n - 1;
        while (k > 0 && ((unsigned char)s[k] & 0xc0) == 0x80) k--;
        size_t cl;
        if (!jlm_jj_py_space(s + k, n - k, &cl) || k + cl != n) break;
        n = k;
    }
    return n;
}

static void emit_data(lexer *L, const char *s, size_t n, int line)
{
    if (!n) return;
    tok *k = push_tok(L, T_DATA, line);
    k->v = jlm_jj_strn(L->C, s, n);
}

/* Decodes a Python string literal body (unicode-escape semantics). */
static jj_val decode_string(jj_ctx *C, const char *s, size_t n)
{
    jj_buf b = {0};
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 == n) { jlm_jj_buf_put(C, &b, s + i, 1); continue; }
        char e = s[++i];
        const char *simple = NULL;
        switch (e) {
        case 'n': simple = "\n"; break;
        case 't': simple = "\t"; break;
        case 'r': simple = "\r"; break;
        case '\\': simple = "\\"; break;
        case '\'': simple = "'"; break;
        case '"': simple = "\""; break;
        case 'a': simple = "\a"; break;
        case 'b': simple = "\b"; break;
        case 'f': simple = "\f"; break;
        case 'v': simple = "\v"; break;
        case '\n': simple = ""; break;
        default: break;
        }
        if (simple) { jlm_jj_buf_puts(C, &b, simple); continue; }
        int nd = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (nd || (e >= '0' && e <= '7')) {
            unsigned long cp = 0;
            if (nd) {
                if (i + (size_t)nd >= n) jlm_jj_fail(C, JLM_EFORMAT, "truncated \\%c escape in string literal", e);
                for (int k = 1; k <= nd; k++) {
                    char h = s[i + (size_t)k];
                    if (!isxdigit((unsigned char)h)) jlm_jj_fail(C, JLM_EFORMAT, "bad \\%c escape in string literal", e);
                    cp = cp * 16 + (unsigned long)(isdigit((unsigned char)h) ? h - '0' : (tolower((unsigned char)h) - 'a' + 10));
                }
                i += (size_t)nd;
            } else {
                int k = 0;
                while (k < 3 && i < n && s[i] >= '0' && s[i] <= '7') { cp = cp * 8 + (unsigned long)(s[i] - '0'); i++; k++; }
                i--;
            }
            if (cp > 0x10ffff) jlm_jj_fail(C, JLM_EFORMAT, "escape out of Unicode range in string literal");
            char u[4];
            int ul;
            if (cp < 0x80) { u[0] = (char)cp; ul = 1; }
            else if (cp < 0x800) { u[0] = (char)(0xc0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 63)); ul = 2; }
            else if (cp < 0x10000) { u[0] = (char)(0xe0 | (cp >> 12)); u[1] = (char)(0x80 | ((cp >> 6) & 63)); u[2] = (char)(0x80 | (cp & 63)); ul = 3; }
            else { u[0] = (char)(0xf0 | (cp >> 18)); u[1] = (char)(0x80 | ((cp >> 12) & 63)); u[2] = (char)(0x80 | ((cp >> 6) & 63)); u[3] = (char)(0x80 | (cp & 63)); ul = 4; }
            jlm_jj_buf_put(C, &b, u, (size_t)ul);
            continue;
        }
        if (e == 'N') jlm_jj_fail(C, JLM_EUNSUPPORTED, "unsupported construct: \\N{...} escape in string literal");
        jlm_jj_buf_put(C, &b, s + i - 1, 2);   /* unknown escape: kept as is */
    }
    return jlm_jj_strn(C, b.p ? b.p : "", b.len);
}

/* An integer or float literal at pos (underscores allowed); returns the end. */
static size_t lex_number(lexer *L, size_t pos)
{
    jj_ctx *C = L->C;
    const char *s = L->src;
    size_t st = pos;
    int isf = 0;
    while (pos < L->n && (isdigit((unsigned char)s[pos]) || s[pos] == '_')) pos++;
    if (pos + 1 < L->n && s[pos] == '.' && isdigit((unsigned char)s[pos + 1])) {
        isf = 1;
        pos++;
        while (pos < L->n && (isdigit((unsigned char)s[pos]) || s[pos] == '_')) pos++;
    }
    if (pos < L->n && (s[pos] == 'e' || s[pos] == 'E')) {
        size_t p2 = pos + 1;
        if (p2 < L->n && (s[p2] == '+' || s[p2] == '-')) p2++;
        if (p2 < L->n && isdigit((unsigned char)s[p2])) {
            isf = 1;
            pos = p2;
            while (pos < L->n && isdigit((unsigned char)s[pos])) pos++;
        }
    }
    char num[64];
    size_t nn = 0;
    for (size_t i = st; i < pos && nn < sizeof num - 1; i++)
        if (s[i] != '_') num[nn++] = s[i];
    num[nn] = 0;
    tok *k = push_tok(L, isf ? T_FLOAT : T_INT, L->line);
    if (isf) k->v = jlm_jj_float(strtod(num, NULL));
    else {
        char *end;
        long long v = strtoll(num, &end, 10);
        if (nn > 18) jlm_jj_fail(C, JLM_EUNSUPPORTED, "unsupported construct: integer literal %s beyond 64 bits", num);
        k->v = jlm_jj_int(v);
    }
    return pos;
}

/* Lexes the inside of a {{ }} or {% %} tag; returns position after the end
 * delimiter (and after the whitespace it consumes). */
static size_t lex_tag(lexer *L, size_t pos, int var, int *trim_out)
{
    jj_ctx *C = L->C;
    const char *s = L->src;
    int depth = 0;
    for (;;) {
        while (pos < L->n && is_ws(s[pos])) { if (s[pos] == '\n') L->line++; pos++; }
        if (pos >= L->n) jlm_jj_fail(C, JLM_EFORMAT, "unexpected end of template inside a %s tag", var ? "{{ }}" : "{% %}");
        C->line = L->line;
        if (depth == 0) {
            const char *e = var ? "}}" : "%}";
            int sign = (s[pos] == '-' || s[pos] == '+') ? s[pos] : 0;
            size_t q = pos + (sign ? 1 : 0);
            if (q + 1 < L->n && s[q] == e[0] && s[q + 1] == e[1]) {
                push_tok(L, var ? T_VAR_END : T_BLOCK_END, L->line);
                *trim_out = sign == '-' ? 2 : (sign == '+' || var) ? 0 : 1;
                return q + 2;
            }
        }
        char c = s[pos];
        if (isalpha((unsigned char)c) || c == '_') {
            size_t st = pos;
            while (pos < L->n && (isalnum((unsigned char)s[pos]) || s[pos] == '_')) pos++;
            tok *k = push_tok(L, T_NAME, L->line);
            k->s = jlm_jj_strdup(C, s + st, pos - st);
            k->n = pos - st;
        } else if (isdigit((unsigned char)c)) {
            pos = lex_number(L, pos);
        } else if (c == '\'' || c == '"') {
            size_t st = ++pos;
            int line0 = L->line;
            while (pos < L->n && s[pos] != c) {
                if (s[pos] == '\\' && pos + 1 < L->n) pos++;
                if (s[pos] == '\n') L->line++;
                pos++;
            }
            if (pos >= L->n) jlm_jj_fail(C, JLM_EFORMAT, "unterminated string literal");
            tok *k = push_tok(L, T_STRING, line0);
            k->v = decode_string(C, s + st, pos - st);
            pos++;
        } else {
            int found = 0;
            for (int i = 0; OPS[i]; i++) {
                size_t ol = strlen(OPS[i]);
                if (pos + ol <= L->n && memcmp(s + pos, OPS[i], ol) == 0) {
                    tok *k = push_tok(L, T_OP, L->line);
                    k->s = OPS[i];
                    k->n = ol;
                    pos += ol;
                    if (strchr("([{", c)) depth++;
                    else if (strchr(")]}", c) && depth > 0) depth--;
                    found = 1;
                    break;
                }
            }
            if (!found) jlm_jj_fail(C, JLM_EFORMAT, "unexpected character '%c'", c);
        }
    }
}

/* After a tag end: trim 2 = strip all whitespace, 1 = one newline (trim_blocks). */
static size_t after_end(lexer *L, size_t pos, int trim, int *line_starting)
{
    const char *s = L->src;
    if (trim == 2) while (pos < L->n && is_ws(s[pos])) { if (s[pos] == '\n') L->line++; pos++; }
    else if (trim == 1 && pos < L->n && s[pos] == '\n') { pos++; L->line++; }
    *line_starting = pos > 0 && s[pos - 1] == '\n';
    return pos;
}

/* Is "{% raw %}" (any spacing, signs) at p? Returns position after it, 0 if not. */
static size_t match_word_tag(const char *s, size_t n, size_t p, const char *word, int *sign_l, int *sign_r)
{
    if (p + 2 > n || s[p] != '{' || s[p + 1] != '%') return 0;
    size_t q = p + 2;
    *sign_l = (q < n && (s[q] == '-' || s[q] == '+')) ? s[q] : 0;
    if (*sign_l) q++;
    while (q < n && is_ws(s[q])) q++;
    size_t wl = strlen(word);
    if (q + wl > n || memcmp(s + q, word, wl) != 0) return 0;
    q += wl;
    if (q < n && (isalnum((unsigned char)s[q]) || s[q] == '_')) return 0;
    while (q < n && is_ws(s[q])) q++;
    *sign_r = (q < n && (s[q] == '-' || s[q] == '+')) ? s[q] : 0;
    if (*sign_r) q++;
    if (q + 2 > n || s[q] != '%' || s[q + 1] != '}') return 0;
    return q + 2;
}

/* Text before a tag, with "-" / lstrip_blocks applied. */
static void text_before(lexer *L, size_t from, size_t to, int kind, int sign, int line_starting, int line)
{
    const char *t = L->src + from;
    size_t len = to - from;
    if (sign == '-') len = rstrip_len(t, len);
    else if (sign != '+' && kind != '{') {
        size_t l_pos = len;
        while (l_pos > 0 && t[l_pos - 1] != '\n') l_pos--;
        if (l_pos > 0 || line_starting) {
            size_t i = l_pos;
            while (i < len && is_ws(t[i])) i++;
            if (i == len && len > l_pos) len = l_pos;
        }
    }
    emit_data(L, t, len, line);
}

static void lex(lexer *L)
{
    jj_ctx *C = L->C;
    const char *s = L->src;
    size_t pos = 0;
    int line_starting = 1;
    for (;;) {
        size_t p = pos;
        while (p + 1 < L->n && !(s[p] == '{' && (s[p + 1] == '{' || s[p + 1] == '%' || s[p + 1] == '#'))) p++;
        if (p + 1 >= L->n) {
            emit_data(L, s + pos, L->n - pos, L->line);
            break;
        }
        int kind = s[p + 1];
        int sign = (p + 2 < L->n && (s[p + 2] == '-' || s[p + 2] == '+')) ? s[p + 2] : 0;
        int line0 = L->line;
        L->line += count_nl(s + pos, p - pos);
        text_before(L, pos, p, kind, sign, line_starting, line0);
        C->line = L->line;
        int sl, sr;
        size_t q = kind == '%' ? match_word_tag(s, L->n, p, "raw", &sl, &sr) : 0;
        if (q) {
            if (sr == '-') while (q < L->n && is_ws(s[q])) { if (s[q] == '\n') L->line++; q++; }
            size_t r = q, e = 0;
            for (; r + 1 < L->n; r++)
                if ((e = match_word_tag(s, L->n, r, "endraw", &sl, &sr))) break;
            if (!e) jlm_jj_fail(C, JLM_EFORMAT, "{%% raw %%} without {%% endraw %%}");
            int rl = L->line;
            L->line += count_nl(s + q, r - q);
            text_before(L, q, r, '%', sl, 0, rl);
            pos = after_end(L, e, sr == '-' ? 2 : sr == '+' ? 0 : 1, &line_starting);
            continue;
        }
        if (kind == '#') {
            const char *e = NULL;
            for (size_t i = p + 2; i + 1 < L->n; i++)
                if (s[i] == '#' && s[i + 1] == '}') { e = s + i; break; }
            if (!e) jlm_jj_fail(C, JLM_EFORMAT, "unterminated comment");
            size_t ei = (size_t)(e - s);
            int trim = (ei > p + 2 && s[ei - 1] == '-') ? 2 : (ei > p + 2 && s[ei - 1] == '+') ? 0 : 1;
            L->line += count_nl(s + p, ei - p);
            pos = after_end(L, ei + 2, trim, &line_starting);
            continue;
        }
        push_tok(L, kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, L->line);
        int trim;
        size_t e = lex_tag(L, p + 2 + (sign ? 1 : 0), kind == '{', &trim);
        pos = after_end(L, e, trim, &line_starting);
    }
    push_tok(L, T_EOF, L->line);
}

/* ================================================================ parser */
typedef struct parser { jj_ctx *C; tok *t; size_t i, n; } parser;

static tok *cur(parser *P) { return &P->t[P->i]; }
static tok *peek(parser *P, size_t k) { return &P->t[P->i + k < P->n ? P->i + k : P->n - 1]; }
static int is_op(tok *k, const char *op) { return k->t == T_OP && strcmp(k->s, op) == 0; }
static int is_name(tok *k, const char *nm) { return k->t == T_NAME && strcmp(k->s, nm) == 0; }

static const char *tok_desc(tok *k)
{
    switch (k->t) {
    case T_DATA: return "template data";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_NAME: case T_OP: return k->s;
    case T_STRING: return "string literal";
    case T_EOF: return "end of template";
    default: return "number";
    }
}

_Noreturn static void unexpected(parser *P, const char *want)
{
    P->C->line = cur(P)->line;
    jlm_jj_fail(P->C, JLM_EFORMAT, "expected %s, got %s", want, tok_desc(cur(P)));
}

static void expect_op(parser *P, const char *op)
{
    if (!is_op(cur(P), op)) unexpected(P, op);
    P->i++;
}

static const char *expect_name(parser *P)
{
    if (cur(P)->t != T_NAME) unexpected(P, "a name");
    return P->t[P->i++].s;
}

static void expect_t(parser *P, int t, const char *what)
{
    if (cur(P)->t != t) unexpected(P, what);
    P->i++;
}

static jj_node *node(parser *P, int kind)
{
    jj_node *n = jlm_jj_alloc(P->C, sizeof(jj_node));
    n->kind = kind;
    n->line = cur(P)->line;
    return n;
}

static void nl_push(jj_ctx *C, jj_nlist *l, jj_node *n)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 4;
        jj_node **nv = jlm_jj_alloc(C, (size_t)cap * sizeof(jj_node *));
        if (l->n) memcpy(nv, l->v, (size_t)l->n * sizeof(jj_node *));
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = n;
}

static void names_push(jj_ctx *C, jj_node *n, const char *nm)
{
    const char **nv = jlm_jj_alloc(C, (size_t)(n->n_names + 1) * sizeof(char *));
    if (n->n_names) memcpy(nv, n->names, (size_t)n->n_names * sizeof(char *));
    nv[n->n_names++] = nm;
    n->names = nv;
}

static jj_node *parse_expr(parser *P, int with_cond);
static jj_node *parse_unary(parser *P, int with_filter);
static jj_node *parse_or(parser *P);

/* expr [, expr ...] -> a tuple when a comma appears (or explicit parens allow empty) */
static jj_node *parse_tuple(parser *P, int with_cond, int explicit_parens)
{
    jj_node *t = node(P, N_TUPLE);
    int comma = 0;
    for (;;) {
        if (t->args.n) {
            if (!is_op(cur(P), ",")) break;
            P->i++;
            comma = 1;
        }
        tok *k = cur(P);
        if (k->t == T_VAR_END || k->t == T_BLOCK_END || is_op(k, ")") || is_name(k, "in") ||
            (t->args.n && (is_op(k, "=") )))
            break;
        nl_push(P->C, &t->args, parse_expr(P, with_cond));
    }
    if (!comma && t->args.n == 1) return t->args.v[0];
    if (!t->args.n && !explicit_parens) unexpected(P, "an expression");
    return t;
}

static void parse_call_args(parser *P, jj_node *call)
{
    expect_op(P, "(");
    while (!is_op(cur(P), ")")) {
        if (call->args.n) expect_op(P, ",");
        if (is_op(cur(P), ")")) break;
        if (is_op(cur(P), "*") || is_op(cur(P), "**")) {
            P->C->line = cur(P)->line;
            jlm_jj_fail(P->C, JLM_EUNSUPPORTED, "unsupported construct: *args/**kwargs in a call");
        }
        const char *kw = NULL;
        if (cur(P)->t == T_NAME && is_op(peek(P, 1), "=")) {
            kw = cur(P)->s;
            P->i += 2;
        } else if (call->n_names && call->names[call->n_names - 1]) {
            unexpected(P, "a keyword argument (positional after keyword)");
        }
        nl_push(P->C, &call->args, parse_expr(P, 1));
        names_push(P->C, call, kw);
    }
    P->i++;
}

static jj_node *parse_primary(parser *P)
{
    tok *k = cur(P);
    jj_node *n;
    if (k->t == T_NAME) {
        P->i++;
        n = node(P, N_LIT);
        n->line = k->line;
        if (!strcmp(k->s, "true") || !strcmp(k->s, "True")) n->lit = jlm_jj_bool(1);
        else if (!strcmp(k->s, "false") || !strcmp(k->s, "False")) n->lit = jlm_jj_bool(0);
        else if (!strcmp(k->s, "none") || !strcmp(k->s, "None")) n->lit = jlm_jj_none();
        else { n->kind = N_NAME; n->name = k->s; }
        return n;
    }
    if (k->t == T_STRING) {
        jj_buf b = {0};
        n = node(P, N_LIT);
        while (cur(P)->t == T_STRING) {
            jlm_jj_buf_put(P->C, &b, cur(P)->v.u.s->s, cur(P)->v.u.s->len);
            P->i++;
        }
        n->lit = jlm_jj_strn(P->C, b.p ? b.p : "", b.len);
        return n;
    }
    if (k->t == T_INT || k->t == T_FLOAT) {
        n = node(P, N_LIT);
        n->lit = k->v;
        P->i++;
        return n;
    }
    if (is_op(k, "(")) {
        P->i++;
        n = parse_tuple(P, 1, 1);
        expect_op(P, ")");
        return n;
    }
    if (is_op(k, "[")) {
        n = node(P, N_LIST);
        P->i++;
        while (!is_op(cur(P), "]")) {
            if (n->args.n) expect_op(P, ",");
            if (is_op(cur(P), "]")) break;
            nl_push(P->C, &n->args, parse_expr(P, 1));
        }
        P->i++;
        return n;
    }
    if (is_op(k, "{")) {
        n = node(P, N_DICT);
        P->i++;
        while (!is_op(cur(P), "}")) {
            if (n->args.n) expect_op(P, ",");
            if (is_op(cur(P), "}")) break;
            nl_push(P->C, &n->args, parse_expr(P, 1));
            expect_op(P, ":");
            nl_push(P->C, &n->args2, parse_expr(P, 1));
        }
        P->i++;
        return n;
    }
    unexpected(P, "an expression");
}

static jj_node *parse_subscript(parser *P, jj_node *obj)
{
    jj_node *n;
    if (is_op(cur(P), ".")) {
        P->i++;
        tok *k = cur(P);
        if (k->t == T_NAME) {
            n = node(P, N_ATTR);
            n->a = obj;
            n->name = k->s;
            P->i++;
            return n;
        }
        if (k->t != T_INT) unexpected(P, "an attribute name");
        n = node(P, N_ITEM);
        n->a = obj;
        n->b = node(P, N_LIT);
        n->b->lit = k->v;
        P->i++;
        return n;
    }
    expect_op(P, "[");
    jj_node *parts[3] = {0};
    int ncolon = 0;
    for (;;) {
        if (is_op(cur(P), ":")) {
            if (ncolon == 2) unexpected(P, "']'");
            ncolon++;
            P->i++;
            continue;
        }
        if (is_op(cur(P), "]")) break;
        if (parts[ncolon]) unexpected(P, "':' or ']'");
        parts[ncolon] = parse_expr(P, 1);
        if (!ncolon && is_op(cur(P), ",")) {   /* x[a, b]: tuple key */
            jj_node *t = node(P, N_TUPLE);
            nl_push(P->C, &t->args, parts[0]);
            while (is_op(cur(P), ",")) {
                P->i++;
                if (is_op(cur(P), "]")) break;
                nl_push(P->C, &t->args, parse_expr(P, 1));
            }
            parts[0] = t;
        }
    }
    P->i++;
    if (ncolon) {
        n = node(P, N_SLICE);
        n->a = obj;
        n->b = parts[0];
        n->c = parts[1];
        n->d = parts[2];
        return n;
    }
    if (!parts[0]) unexpected(P, "an index");
    n = node(P, N_ITEM);
    n->a = obj;
    n->b = parts[0];
    return n;
}

static jj_node *parse_postfix(parser *P, jj_node *n)
{
    for (;;) {
        if (is_op(cur(P), ".") || is_op(cur(P), "[")) n = parse_subscript(P, n);
        else if (is_op(cur(P), "(")) {
            jj_node *c = node(P, N_CALL);
            c->a = n;
            parse_call_args(P, c);
            n = c;
        } else return n;
    }
}

static const char *dotted_name(parser *P)
{
    const char *nm = expect_name(P);
    while (is_op(cur(P), ".") && peek(P, 1)->t == T_NAME) {
        P->i++;
        size_t a = strlen(nm), b = strlen(cur(P)->s);
        char *j = jlm_jj_alloc(P->C, a + b + 2);
        memcpy(j, nm, a);
        j[a] = '.';
        memcpy(j + a + 1, cur(P)->s, b + 1);
        nm = j;
        P->i++;
    }
    return nm;
}

static jj_node *parse_filter_expr(parser *P, jj_node *n)
{
    for (;;) {
        if (is_op(cur(P), "|")) {
            P->i++;
            jj_node *f = node(P, N_FILTER);
            f->a = n;
            f->name = dotted_name(P);
            if (is_op(cur(P), "(")) parse_call_args(P, f);
            n = f;
        } else if (is_name(cur(P), "is")) {
            P->i++;
            jj_node *t = node(P, N_TEST);
            if (is_name(cur(P), "not")) { t->op = 1; P->i++; }
            t->a = n;
            t->name = dotted_name(P);
            tok *k = cur(P);
            if (is_op(k, "(")) parse_call_args(P, t);
            else if ((k->t == T_NAME || k->t == T_STRING || k->t == T_INT || k->t == T_FLOAT ||
                      is_op(k, "[") || is_op(k, "{")) &&
                     !is_name(k, "else") && !is_name(k, "or") && !is_name(k, "and") &&
                     !is_name(k, "if") && !is_name(k, "in") && !is_name(k, "is") && !is_name(k, "not")) {
                jj_node *arg = parse_postfix(P, parse_primary(P));
                nl_push(P->C, &t->args, arg);
                names_push(P->C, t, NULL);
            }
            n = t;
        } else if (is_op(cur(P), "(")) {
            jj_node *c = node(P, N_CALL);
            c->a = n;
            parse_call_args(P, c);
            n = c;
        } else return n;
    }
}

static jj_node *parse_unary(parser *P, int with_filter)
{
    jj_node *n;
    if (is_op(cur(P), "-") || is_op(cur(P), "+")) {
        n = node(P, is_op(cur(P), "-") ? N_NEG : N_POS);
        P->i++;
        n->a = parse_unary(P, 0);
    } else n = parse_primary(P);
    n = parse_postfix(P, n);
    if (with_filter) n = parse_filter_expr(P, n);
    return n;
}

static jj_node *binop(parser *P, int op, jj_node *a, jj_node *b)
{
    jj_node *n = node(P, N_BIN);
    n->op = op;
    n->a = a;
    n->b = b;
    n->line = a->line;
    return n;
}

static jj_node *parse_pow(parser *P)
{
    jj_node *n = parse_unary(P, 1);
    while (is_op(cur(P), "**")) { P->i++; n = binop(P, OP_POW, n, parse_unary(P, 1)); }
    return n;
}

static jj_node *parse_math2(parser *P)
{
    jj_node *n = parse_pow(P);
    for (;;) {
        int op = is_op(cur(P), "*") ? OP_MUL : is_op(cur(P), "/") ? OP_DIV : is_op(cur(P), "//") ? OP_FLOORDIV
               : is_op(cur(P), "%") ? OP_MOD : 0;
        if (!op) return n;
        P->i++;
        n = binop(P, op, n, parse_pow(P));
    }
}

static jj_node *parse_concat(parser *P)
{
    jj_node *n = parse_math2(P);
    while (is_op(cur(P), "~")) { P->i++; n = binop(P, OP_CONCAT, n, parse_math2(P)); }
    return n;
}

static jj_node *parse_math1(parser *P)
{
    jj_node *n = parse_concat(P);
    for (;;) {
        int op = is_op(cur(P), "+") ? OP_ADD : is_op(cur(P), "-") ? OP_SUB : 0;
        if (!op) return n;
        P->i++;
        n = binop(P, op, n, parse_concat(P));
    }
}

/* a < b < c == (a < b) and (b < c) (b evaluated twice; expressions are pure). */
static jj_node *parse_compare(parser *P)
{
    jj_node *left = parse_math1(P), *res = NULL;
    for (;;) {
        tok *k = cur(P);
        int op = is_op(k, "==") ? OP_EQ : is_op(k, "!=") ? OP_NE : is_op(k, "<") ? OP_LT : is_op(k, "<=") ? OP_LE
               : is_op(k, ">") ? OP_GT : is_op(k, ">=") ? OP_GE : is_name(k, "in") ? OP_IN : 0;
        if (!op && is_name(k, "not") && is_name(peek(P, 1), "in")) { op = OP_NOTIN; P->i++; }
        if (!op) break;
        P->i++;
        jj_node *right = parse_math1(P);
        jj_node *c = binop(P, op, left, right);
        c->kind = N_CMP;
        if (res) {
            jj_node *a = node(P, N_AND);
            a->a = res;
            a->b = c;
            res = a;
        } else res = c;
        left = right;
    }
    return res ? res : left;
}

static jj_node *parse_not(parser *P)
{
    if (is_name(cur(P), "not")) {
        jj_node *n = node(P, N_NOT);
        P->i++;
        n->a = parse_not(P);
        return n;
    }
    return parse_compare(P);
}

static jj_node *parse_and(parser *P)
{
    jj_node *n = parse_not(P);
    while (is_name(cur(P), "and")) {
        jj_node *a = node(P, N_AND);
        P->i++;
        a->a = n;
        a->b = parse_not(P);
        n = a;
    }
    return n;
}

static jj_node *parse_or(parser *P)
{
    jj_node *n = parse_and(P);
    while (is_name(cur(P), "or")) {
        jj_node *a = node(P, N_OR);
        P->i++;
        a->a = n;
        a->b = parse_and(P);
        n = a;
    }
    return n;
}

static jj_node *parse_expr(parser *P, int with_cond)
{
    if (++P->C->depth > JJ_MAX_DEPTH) jlm_jj_fail(P->C, JLM_ERANGE, "expression nested deeper than %d", JJ_MAX_DEPTH);
    jj_node *n = parse_or(P);
    while (with_cond && is_name(cur(P), "if")) {
        jj_node *c = node(P, N_COND);
        P->i++;
        c->a = parse_or(P);   /* condition */
        c->b = n;             /* value if true */
        if (is_name(cur(P), "else")) {
            P->i++;
            c->c = parse_expr(P, 1);
        }
        n = c;
    }
    P->C->depth--;
    return n;
}

/* ================================================================ statements */
static jj_nlist parse_body(parser *P, const char *const *ends);

static int at_end_tag(parser *P, const char *const *ends)
{
    if (cur(P)->t != T_BLOCK_BEGIN) return 0;
    tok *k = peek(P, 1);
    for (int i = 0; ends && ends[i]; i++)
        if (is_name(k, ends[i])) return 1;
    return 0;
}

/* Consumes "{% name" and returns the name (caller parses the rest). */
static const char *end_tag_name(parser *P)
{
    P->i++;
    return P->t[P->i++].s;
}

static void parse_set_target(parser *P, jj_node *n)
{
    const char *nm = expect_name(P);
    if (is_op(cur(P), ".")) {   /* ns.attr */
        P->i++;
        n->name = expect_name(P);
        n->a = node(P, N_NAME);
        n->a->name = nm;
        return;
    }
    names_push(P->C, n, nm);
    while (is_op(cur(P), ",")) {
        P->i++;
        names_push(P->C, n, expect_name(P));
    }
}

static jj_node *parse_for(parser *P)
{
    static const char *const ends[] = {"else", "endfor", NULL};
    jj_node *n = node(P, N_FOR);
    do {
        if (n->n_names) P->i++;
        if (is_op(cur(P), "(")) unexpected(P, "a loop variable name");
        names_push(P->C, n, expect_name(P));
    } while (is_op(cur(P), ","));
    if (!is_name(cur(P), "in")) unexpected(P, "'in'");
    P->i++;
    n->a = parse_tuple(P, 0, 0);
    if (is_name(cur(P), "if")) { P->i++; n->b = parse_expr(P, 1); }
    if (is_name(cur(P), "recursive")) {
        P->C->line = cur(P)->line;
        jlm_jj_fail(P->C, JLM_EUNSUPPORTED, "unsupported construct: recursive for loop");
    }
    expect_t(P, T_BLOCK_END, "'%}'");
    n->args = parse_body(P, ends);
    if (!strcmp(end_tag_name(P), "else")) {
        static const char *const e2[] = {"endfor", NULL};
        expect_t(P, T_BLOCK_END, "'%}'");
        n->args2 = parse_body(P, e2);
        end_tag_name(P);
    }
    expect_t(P, T_BLOCK_END, "'%}'");
    return n;
}

static jj_node *parse_if(parser *P)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    jj_node *n = node(P, N_IF), *top = n;
    n->a = parse_tuple(P, 1, 0);
    expect_t(P, T_BLOCK_END, "'%}'");
    for (;;) {
        n->args = parse_body(P, ends);
        const char *e = end_tag_name(P);
        if (!strcmp(e, "elif")) {
            jj_node *m = node(P, N_IF);
            m->a = parse_tuple(P, 1, 0);
            expect_t(P, T_BLOCK_END, "'%}'");
            nl_push(P->C, &n->args2, m);
            n = m;
            continue;
        }
        if (!strcmp(e, "else")) {
            static const char *const e2[] = {"endif", NULL};
            expect_t(P, T_BLOCK_END, "'%}'");
            n->args2 = parse_body(P, e2);
            end_tag_name(P);
        }
        expect_t(P, T_BLOCK_END, "'%}'");
        return top;
    }
}

static int uses_name(jj_node *n, const char *nm)
{
    if (!n) return 0;
    if (n->kind == N_NAME && !strcmp(n->name, nm)) return 1;
    if (uses_name(n->a, nm) || uses_name(n->b, nm) || uses_name(n->c, nm) || uses_name(n->d, nm)) return 1;
    for (int i = 0; i < n->args.n; i++) if (uses_name(n->args.v[i], nm)) return 1;
    for (int i = 0; i < n->args2.n; i++) if (uses_name(n->args2.v[i], nm)) return 1;
    return 0;
}

/* (a, b=1, ...) into n->names / n->args2 (defaults, NULL when none). */
static void parse_params(parser *P, jj_node *n)
{
    expect_op(P, "(");
    while (!is_op(cur(P), ")")) {
        if (n->n_names) expect_op(P, ",");
        if (is_op(cur(P), ")")) break;
        names_push(P->C, n, expect_name(P));
        jj_node *def = NULL;
        if (is_op(cur(P), "=")) { P->i++; def = parse_expr(P, 1); }
        nl_push(P->C, &n->args2, def);
    }
    P->i++;
}

static void set_macro_flags(jj_node *n)
{
    for (int i = 0; i < n->args.n; i++) {
        if (uses_name(n->args.v[i], "varargs")) n->flags |= 1;
        if (uses_name(n->args.v[i], "kwargs")) n->flags |= 2;
        if (uses_name(n->args.v[i], "caller")) n->flags |= 4;
    }
}

static jj_node *parse_set(parser *P)
{
    jj_node *n;
    n = node(P, N_SET);
    parse_set_target(P, n);
    if (is_op(cur(P), "=")) {
        P->i++;
        n->b = parse_tuple(P, 1, 0);
        expect_t(P, T_BLOCK_END, "'%}'");
        return n;
    }
    static const char *const ends[] = {"endset", NULL};
    n->kind = N_SETBLOCK;
    if (is_op(cur(P), "|")) {   /* {% set x | filter %} */
        jj_node *dummy = node(P, N_LIT);
        dummy->lit = jlm_jj_undef(NULL);
        n->c = parse_filter_expr(P, dummy);
    }
    expect_t(P, T_BLOCK_END, "'%}'");
    n->args = parse_body(P, ends);
    end_tag_name(P);
    expect_t(P, T_BLOCK_END, "'%}'");
    return n;
}

static jj_node *parse_macro_or_call(parser *P, const char *nm)
{
    jj_node *n;
    int is_macro = nm[0] == 'm';
    static const char *const em[] = {"endmacro", NULL}, *const ec[] = {"endcall", NULL};
    n = node(P, is_macro ? N_MACRO : N_CALLBLOCK);
    if (is_macro) n->name = expect_name(P);
    if (is_macro || is_op(cur(P), "(")) parse_params(P, n);
    if (!is_macro) n->a = parse_expr(P, 1);
    if (!is_macro && n->a->kind != N_CALL) unexpected(P, "a call after {% call %}");
    expect_t(P, T_BLOCK_END, "'%}'");
    n->args = parse_body(P, is_macro ? em : ec);
    end_tag_name(P);
    if (cur(P)->t == T_NAME) P->i++;   /* {% endmacro name %} */
    expect_t(P, T_BLOCK_END, "'%}'");
    set_macro_flags(n);
    return n;
}

static jj_node *parse_stmt(parser *P)
{
    tok *k = cur(P);
    if (k->t != T_NAME) unexpected(P, "a tag name");
    const char *nm = k->s;
    P->C->line = k->line;
    P->i++;
    jj_node *n;
    if (!strcmp(nm, "if")) return parse_if(P);
    if (!strcmp(nm, "for")) return parse_for(P);
    if (!strcmp(nm, "set")) return parse_set(P);
    if (!strcmp(nm, "macro") || !strcmp(nm, "call")) return parse_macro_or_call(P, nm);
    if (!strcmp(nm, "filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        n = node(P, N_FILTERBLOCK);
        jj_node *dummy = node(P, N_LIT);
        dummy->lit = jlm_jj_undef(NULL);
        jj_node *f = node(P, N_FILTER);
        f->a = dummy;
        f->name = dotted_name(P);
        if (is_op(cur(P), "(")) parse_call_args(P, f);
        n->c = parse_filter_expr(P, f);
        expect_t(P, T_BLOCK_END, "'%}'");
        n->args = parse_body(P, ends);
        end_tag_name(P);
        expect_t(P, T_BLOCK_END, "'%}'");
        return n;
    }
    if (!strcmp(nm, "break") || !strcmp(nm, "continue")) {
        n = node(P, nm[0] == 'b' ? N_BREAK : N_CONTINUE);
        expect_t(P, T_BLOCK_END, "'%}'");
        return n;
    }
    if (!strcmp(nm, "do")) {
        n = node(P, N_DO);
        n->a = parse_tuple(P, 1, 0);
        expect_t(P, T_BLOCK_END, "'%}'");
        return n;
    }
    if (!strcmp(nm, "generation")) {   /* transformers' AssistantTracker: renders its body */
        static const char *const ends[] = {"endgeneration", NULL};
        expect_t(P, T_BLOCK_END, "'%}'");
        n = node(P, N_BODY);
        n->args = parse_body(P, ends);
        end_tag_name(P);
        expect_t(P, T_BLOCK_END, "'%}'");
        return n;
    }
    if (!strcmp(nm, "with")) {
        static const char *const ends[] = {"endwith", NULL};
        n = node(P, N_WITH);
        while (cur(P)->t != T_BLOCK_END) {
            if (n->n_names) expect_op(P, ",");
            names_push(P->C, n, expect_name(P));
            expect_op(P, "=");
            nl_push(P->C, &n->args2, parse_expr(P, 1));
        }
        P->i++;
        n->args = parse_body(P, ends);
        end_tag_name(P);
        expect_t(P, T_BLOCK_END, "'%}'");
        return n;
    }
    jlm_jj_fail(P->C, JLM_EUNSUPPORTED, "unsupported construct: {%% %s %%} tag", nm);
}

static jj_nlist parse_body(parser *P, const char *const *ends)
{
    jj_nlist body = {0};
    for (;;) {
        tok *k = cur(P);
        P->C->line = k->line;
        if (k->t == T_EOF) {
            if (ends) jlm_jj_fail(P->C, JLM_EFORMAT, "unexpected end of template, expected {%% %s %%}", ends[0]);
            return body;
        }
        if (k->t == T_DATA) {
            jj_node *n = node(P, N_TEXT);
            n->lit = k->v;
            P->i++;
            nl_push(P->C, &body, n);
        } else if (k->t == T_VAR_BEGIN) {
            P->i++;
            jj_node *n = node(P, N_EMIT);
            n->a = parse_tuple(P, 1, 0);
            expect_t(P, T_VAR_END, "'}}'");
            nl_push(P->C, &body, n);
        } else if (k->t == T_BLOCK_BEGIN) {
            if (at_end_tag(P, ends)) return body;
            tok *nm = peek(P, 1);
            if (nm->t == T_NAME && (!strncmp(nm->s, "end", 3) || !strcmp(nm->s, "elif") || !strcmp(nm->s, "else"))) {
                P->C->line = nm->line;
                jlm_jj_fail(P->C, JLM_EFORMAT, "unexpected {%% %s %%}%s%s", nm->s, ends ? ", expected {% " : "",
                        ends ? ends[0] : "");
            }
            P->i++;
            nl_push(P->C, &body, parse_stmt(P));
        } else unexpected(P, "template data or a tag");
    }
}

/* Normalises newlines, drops one trailing newline, lexes and parses. */
jj_node *jlm_jj_parse(jj_ctx *C, const char *src, size_t len)
{
    char *s = jlm_jj_alloc(C, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else s[n++] = src[i];
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    lexer L = {.C = C, .src = s, .n = n, .line = 1};
    lex(&L);
    parser P = {.C = C, .t = L.toks, .n = L.ntok};
    jj_node *root = jlm_jj_alloc(C, sizeof(jj_node));
    root->kind = N_BODY;
    root->line = 1;
    C->depth = 0;
    root->args = parse_body(&P, NULL);
    return root;
}

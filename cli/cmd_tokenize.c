/* cmd_tokenize.c - `jlm tokenize MODEL TEXT [--ids] [--no-bos] [--parse-special]`
 * with llama-tokenize's habits: one "id -> 'piece'" line per token, or with
 * --ids one bracketed list. MODEL may be a vocab-only container. */
#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/report.h"
#include "text/tokenizer/tokenizer.h"
#include "format/jlm_format.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "   id -> 'piece'": a piece's control bytes (a newline token, or ESC from
 * a crafted vocabulary) as C escapes: one line per token, nothing that
 * drives the terminal. */
static void print_piece(int32_t id, const char *p, size_t len)
{
    printf("%6d -> '", id);
    for (size_t k = 0; k < len; k++) {
        unsigned char ch = (unsigned char)p[k];
        if (ch == '\n')
            fputs("\\n", stdout);
        else if (ch == '\t')
            fputs("\\t", stdout);
        else if (ch == '\r')
            fputs("\\r", stdout);
        else if (ch < 0x20 || ch == 0x7f)
            printf("\\x%02x", ch);
        else
            putchar(ch);
    }
    puts("'");
}

int jlm_cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL, *text = NULL;
    int ids_only = 0, no_bos = 0, parse_special = 0;
    const jlm_opt t[] = {
        {"-m", "--model", JLM_OPT_STR, &model, 0, 0, 0, "FILE", "the model (or give it first)"},
        {"-p", "--prompt", JLM_OPT_STR, &text, 0, 0, 0, "TEXT", "the text (or give it after MODEL)"},
        {NULL, "--ids", JLM_OPT_FLAG, &ids_only, 0, 0, 0, NULL, "print only the ids, as a JSON list"},
        {NULL, "--no-bos", JLM_OPT_FLAG, &no_bos, 0, 0, 0, NULL, "do not add the BOS token"},
        {NULL, "--parse-special", JLM_OPT_FLAG, &parse_special, 0, 0, 0, NULL, "special-token text becomes its id"},
    };
    const char *pos[2] = {0};
    jlm_opts_spec os = {"jlm tokenize", "MODEL TEXT [options]", t, (int)(sizeof t / sizeof t[0]), pos, 2, 0};
    int prc = jlm_opts_parse(&os, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    for (int k = 0; k < os.n_pos; k++) {
        if (!model) model = pos[k];
        else if (!text) text = pos[k];
        else return jlm_cli_error("jlm tokenize", "too many arguments (see --help)"), 2;
    }
    if (!model || !text) {
        jlm_opts_help(stderr, &os);
        return 2;
    }
    if (!(model = jlm_cli_resolve_model("jlm tokenize", model)))
        return 1;
    jlm_err err = {0};
    jlm_model *m = NULL;
    jlm_tok *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 1;
    char *file = jlm_cli_container_path(model);   /* a view directory: its model.jlm */
    if (!file) {
        jlm_cli_error("jlm tokenize", "out of memory");
        return 1;
    }
    int orc = jlm_fmt_open(file, &m, &err);
    free(file);
    if (orc || jlm_tok_create(&m->vocab, &tok, &err) ||
        jlm_tok_encode(tok, text, strlen(text), !no_bos, parse_special, &ids, &n, &err)) {
        jlm_cli_error("jlm tokenize", err.msg);
        goto out;
    }
    if (ids_only) {
        putchar('[');
        for (size_t i = 0; i < n; i++)
            printf("%s%d", i ? ", " : "", ids[i]);
        puts("]");
    } else {
        for (size_t i = 0; i < n; i++) {
            const char *p;
            size_t len;
            if (jlm_tok_piece(tok, ids[i], 1, &p, &len, &err)) {
                jlm_cli_error("jlm tokenize", err.msg);
                goto out;
            }
            print_piece(ids[i], p, len);
        }
    }
    rc = 0;
out:
    free(ids);
    jlm_tok_destroy(tok);
    jlm_fmt_close(m);
    return rc;
}

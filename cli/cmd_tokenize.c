/* cmd_tokenize.c - `jlm tokenize MODEL TEXT [--ids] [--no-bos] [--parse-special]`
 * with llama-tokenize's habits: one "id -> 'piece'" line per token, or with
 * --ids one bracketed list. MODEL may be a vocab-only container. */
#include "cli/cli.h"
#include "text/tokenizer/tokenizer.h"
#include "format/jlm_format.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int jlm_cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL, *text = NULL;
    int ids_only = 0, no_bos = 0, parse_special = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ids")) ids_only = 1;
        else if (!strcmp(argv[i], "--no-bos")) no_bos = 1;
        else if (!strcmp(argv[i], "--parse-special")) parse_special = 1;
        else if (!strcmp(argv[i], "-p") && i + 1 < argc) text = argv[++i];
        else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "jlm tokenize: unknown option '%s'\n", argv[i]);
            return 2;
        } else if (!model) model = argv[i];
        else if (!text) text = argv[i];
        else { fprintf(stderr, "usage: jlm tokenize MODEL TEXT [--ids] [--no-bos] [--parse-special]\n"); return 2; }
    }
    if (!model || !text) {
        fprintf(stderr, "usage: jlm tokenize MODEL TEXT [--ids] [--no-bos] [--parse-special]\n");
        return 2;
    }
    if (jlm_cli_is_gguf(model)) {
        fprintf(stderr, "jlm tokenize: %s: a GGUF file; convert it first with `jlm convert %s`\n", model, model);
        return 1;
    }
    jlm_err err = {0};
    jlm_model *m = NULL;
    jlm_tok *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 1;
    if (jlm_fmt_open(model, &m, &err) || jlm_tok_create(&m->vocab, &tok, &err) ||
        jlm_tok_encode(tok, text, strlen(text), !no_bos, parse_special, &ids, &n, &err)) {
        fprintf(stderr, "jlm tokenize: %s\n", err.msg);
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
                fprintf(stderr, "jlm tokenize: %s\n", err.msg);
                goto out;
            }
            printf("%6d -> '%.*s'\n", ids[i], (int)len, p);
        }
    }
    rc = 0;
out:
    free(ids);
    jlm_tok_destroy(tok);
    jlm_fmt_close(m);
    return rc;
}

/* grammar_opt.c - `--grammar FILE` / `--json-schema FILE` of jlm run: the
 * file read, compiled (a schema through jlm_gram_from_schema) and a matcher
 * over the tokenizer's vocab made ready for jlm_session_generate. */
#include "cli/run_int.h"
#include "cli/opts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void jlm_cli_gram_free(jlm_cli_gram *c)
{
    jlm_gram_match_free(c->m);
    jlm_gram_vocab_free(c->v);
    jlm_gram_free(c->g);
    memset(c, 0, sizeof *c);
}

int jlm_cli_gram_load(const char *who, const char *grammar_file, const char *schema_file, const jlm_tok *tok,
                      jlm_cli_gram *out)
{
    memset(out, 0, sizeof *out);
    if (!grammar_file && !schema_file)
        return 0;
    if (grammar_file && schema_file) {
        fprintf(stderr, "%s: --grammar and --json-schema exclude each other\n", who);
        return 1;
    }
    if (!tok) {
        fprintf(stderr, "%s: a grammar needs the model's vocabulary, and this container has none\n", who);
        return 1;
    }
    const char *file = grammar_file ? grammar_file : schema_file, *opt = grammar_file ? "--grammar" : "--json-schema";
    char *text = jlm_opts_read_text(who, opt, file, JLM_GRAM_MAX_SRC), *gbnf = NULL;
    if (!text)
        return 1;
    jlm_err err = {0};
    int rc = 0;
    if (schema_file && jlm_gram_from_schema(text, strlen(text), &gbnf, &err))
        rc = 1;
    const char *src = gbnf ? gbnf : text;
    if (!rc && (jlm_gram_parse(src, strlen(src), &out->g, &err) || jlm_gram_vocab_from_tok(tok, &out->v, &err) ||
                jlm_gram_match_new(out->g, &out->m, &err)))
        rc = 1;
    if (rc) {
        fprintf(stderr, "%s: %s %s: %s\n", who, opt, file, err.msg);
        jlm_cli_gram_free(out);
    }
    free(gbnf);
    free(text);
    return rc;
}

/* test_cli.c - `jlm tokenize` and `jlm chat` as a user runs them. */
#include <criterion/criterion.h>

#include "converter/convert.h"
#include "tests/testutil.h"

static char *convert(const char *gguf, const char *dir, const char *name)
{
    jlm_err err = {0};
    char *out = tu_convert(gguf, dir, name, &err);
    cr_assert_not_null(out, "%s", err.msg);
    return out;
}

Test(cli_tokenize, prints_llama_cpp_ids_for_a_model_and_a_vocab_only_container)
{
    char *dir = tu_tmpdir();
    char *m = convert("stories260K.gguf", dir, "s.jlm");
    char cmd[2048], *o = NULL;
    snprintf(cmd, sizeof cmd, "%s tokenize %s 'Once upon a time' --ids", tu_jlm(), m);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    cr_assert_str_eq(o, "[1, 403, 407, 261, 378]\n", "reference prompt_ids");
    free(o);
    snprintf(cmd, sizeof cmd, "%s tokenize %s 'Once upon a time' --ids --no-bos", tu_jlm(), m);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    cr_assert_str_eq(o, "[403, 407, 261, 378]\n");
    free(o);
    snprintf(cmd, sizeof cmd, "%s tokenize %s 'a<s>b' --ids --no-bos --parse-special", tu_jlm(), m);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    cr_assert(strstr(o, ", 1, "), "--parse-special turns <s> into BOS: %s", o);
    free(o);
    char *v = convert("vocab/ggml-vocab-llama-spm.gguf", dir, "spm.jlm");
    snprintf(cmd, sizeof cmd, "%s tokenize %s ' Hello' --ids --no-bos", tu_jlm(), v);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    /* tests/models/vocab/ggml-vocab-llama-spm.gguf.inp/.out: " Hello" -> 259 15043 */
    cr_assert_str_eq(o, "[29871, 15043]\n", "vocab-only container tokenizes: %s", o);
    free(o);
    free(m); free(v);
    tu_rmrf(dir);
    free(dir);
}

Test(cli_chat, first_reply_equals_greedy_generation_on_the_rendered_prompt, .timeout = 60)
{
    char *dir = tu_tmpdir();
    char *m = convert("stories260K.gguf", dir, "s.jlm");
    char cmd[4096], *chat = NULL, *run = NULL;
    snprintf(cmd, sizeof cmd, "(printf 'Hello there\\n' | %s chat %s -n 12 --temp 0 2>/dev/null)", tu_jlm(), m);
    cr_assert_eq(tu_run(cmd, &chat), 0, "%s", chat);
    /* stories260K has no template: chat falls back to chatml (as llama.cpp) */
    /* (the x keeps the prompt's final newline through command substitution) */
    snprintf(cmd, sizeof cmd, "(p=$(printf '<|im_start|>user\\nHello there<|im_end|>\\n<|im_start|>assistant\\nx'); "
             "%s run %s -p \"${p%%x}\" -n 12 --temp 0 2>/dev/null)", tu_jlm(), m);
    cr_assert_eq(tu_run(cmd, &run), 0, "%s", run);
    cr_assert(strlen(run) > 0, "run generated text");
    cr_assert(!strncmp(chat, run, strlen(run)), "chat reply '%s' starts with run's '%s'", chat, run);
    free(chat); free(run); free(m);
    tu_rmrf(dir);
    free(dir);
}

Test(cli_chat, keeps_the_conversation_and_answers_every_line, .timeout = 60)
{
    char *dir = tu_tmpdir();
    char *m = convert("stories260K.gguf", dir, "s.jlm");
    char cmd[2048], *o = NULL;
    snprintf(cmd, sizeof cmd, "(printf 'one\\ntwo\\nthree\\n' | %s chat %s -n 6 --temp 0 2>/dev/null)", tu_jlm(), m);
    cr_assert_eq(tu_run(cmd, &o), 0, "%s", o);
    int lines = 0;
    for (char *p = o; *p; p++) lines += *p == '\n';
    cr_assert(lines >= 3, "one reply per user line: '%s'", o);
    free(o); free(m);
    tu_rmrf(dir);
    free(dir);
}

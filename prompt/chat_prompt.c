/* chat_prompt.c - the template `jlm chat` and `jlm serve` render with. */
#include "prompt/chat_prompt.h"
#include "text/template/chat.h"

#include <stdlib.h>
#include <string.h>

static const char CHATML[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

int jlm_chat_template_or_chatml(const char *path, const jlm_vocab *v, char **tmpl, char **bos, char **eos,
                                int *fallback, jlm_err *err)
{
    if (jlm_chat_template_from_vocab(v, path, tmpl, bos, eos, err) == 0) {
        *fallback = 0;
        return 0;
    }
    char *t = strdup(CHATML);
    char *b = strdup(v->bos >= 0 ? v->tokens[v->bos].s : "");
    char *e = strdup(v->eos >= 0 ? v->tokens[v->eos].s : "");
    if (!t || !b || !e) {
        free(t); free(b); free(e);
        return jlm_errf(err, JLM_ENOMEM, "%s: chat template: out of memory", path);
    }
    *tmpl = t; *bos = b; *eos = e;
    *fallback = 1;
    return 0;
}

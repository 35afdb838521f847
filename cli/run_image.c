/* run_image.c - the image prefill of `jlm run --image FILE`: decode the
 * image, open the container's vision tower, run the prompt around it. */
#include "cli/cli.h"
#include "prompt/image_prompt.h"

int jlm_cli_prefill_image(jlm_engine *e, const jlm_tok *tok, const char *image, const char *prompt, float *logits,
                          int32_t **ids, size_t *n_ids, jlm_err *err)
{
    jlm_image img = {0};
    jlm_vtower *vt = NULL;
    int rc = jlm_image_load(image, &img, err);
    if (!rc)
        rc = jlm_vtower_open(e, &vt, err);
    if (!rc)
        rc = jlm_image_prompt_eval(e, vt, tok, prompt ? prompt : "", &img, logits, ids, n_ids, err);
    jlm_vtower_close(vt);
    jlm_image_free(&img);
    return rc;
}

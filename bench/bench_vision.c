/* bench_vision.c - the vision tower's cost against the text model's, in the
 * same run: one image encode (preprocessing + tower + projector) as a ratio to
 * one text-token decode of the same container, and the tower's page-ins per
 * image at an unlimited and at a one-frame budget.
 *
 *   build/bench/bench_vision [-r REPS] [-t THREADS] [--root DIR]
 *
 * Model: tests/models/synth-gemma3v-128.F32.gguf + mmproj-tinygemma3.gguf,
 * converted into a temp dir (the bench needs the repo's test models). */
#include "bench/bench_common.h"
#include "engine/model.h"
#include "engine/vision.h"

#include <string.h>

static const char *root = ".";

static char *model_path(const char *name)
{
    char *p = NULL;
    if (asprintf(&p, "%s/tests/models/%s", root, name) < 0)
        exit(1);
    return p;
}

static int convert(const char *out)
{
    char *text = model_path("synth-gemma3v-128.F32.gguf"), *mm = model_path("mmproj-tinygemma3.gguf");
    jlm_conv *c;
    jlm_err err = {0};
    int rc = jlm_conv_open_mm(text, mm, NULL, &c, &err);
    if (!rc) {
        rc = jlm_conv_write(c, out, NULL, NULL, NULL, &err);
        jlm_conv_close(c);
    }
    if (rc)
        fprintf(stderr, "bench_vision: %s\n", err.msg);
    free(text);
    free(mm);
    return rc;
}

/* Mean seconds of one image encode and of one text-token decode. */
static int time_both(jlm_engine *e, jlm_vtower *vt, const jlm_image *img, int reps, double *t_img, double *t_tok)
{
    const jlm_vision *v = &jlm_engine_model(e)->vision;
    size_t px = (size_t)v->image_size * v->image_size * 3;
    float *pix = malloc(px * sizeof *pix), *out = malloc((size_t)jlm_vtower_n_tokens(vt) * jlm_vtower_n_embd(vt) * 4);
    float *logits = malloc(jlm_engine_n_vocab(e) * sizeof *logits);
    jlm_err err = {0};
    int rc = !pix || !out || !logits;
    int32_t prompt[8] = {1, 410, 455, 406, 429, 325, 430, 411};
    if (!rc) rc = jlm_engine_eval(e, prompt, 8, logits, &err);
    double a = bench_now();
    for (int r = 0; r < reps && !rc; r++) {
        rc = jlm_vision_preprocess(v, img, NULL, pix, &err);
        if (!rc) rc = jlm_vtower_encode(vt, pix, out, &err);
    }
    double b = bench_now();
    for (int r = 0; r < reps * 8 && !rc; r++) {
        int32_t id = 467;
        rc = jlm_engine_eval(e, &id, 1, logits, &err);
        jlm_engine_rewind(e, 8);
    }
    double c = bench_now();
    if (rc)
        fprintf(stderr, "bench_vision: %s\n", err.msg[0] ? err.msg : "out of memory");
    *t_img = (b - a) / reps;
    *t_tok = (c - b) / (reps * 8);
    free(pix); free(out); free(logits);
    return rc;
}

/* Vision page-ins for `images` encodes at a budget (0 = unlimited). */
static int page_ins(const char *path, uint64_t budget, const jlm_image *img, int images, uint64_t *ins, uint64_t *ev)
{
    jlm_engine_opts o = {.n_threads = 1, .budget = budget, .n_ctx = 512, .quiet = 1};
    jlm_engine *e;
    jlm_vtower *vt = NULL;
    jlm_err err = {0};
    int rc = jlm_engine_open(path, &o, &e, &err);
    if (rc) {
        fprintf(stderr, "bench_vision: %s\n", err.msg);
        return rc;
    }
    static float pix[4096 * 3], out[256 * 128];
    rc = jlm_vtower_open(e, &vt, &err);
    for (int i = 0; i < images && !rc; i++) {
        rc = jlm_vision_preprocess(&jlm_engine_model(e)->vision, img, NULL, pix, &err);
        if (!rc) rc = jlm_vtower_encode(vt, pix, out, &err);
        int32_t id = 1;   /* a text token between images, as in a conversation */
        if (!rc) rc = jlm_engine_eval(e, &id, 1, NULL, &err);
    }
    jlm_pager_counters pc;
    jlm_pager_stats(jlm_engine_pager(e), &pc);
    *ins = pc.a[JLM_PAGER_VISION].page_ins;
    *ev = pc.a[JLM_PAGER_VISION].evictions;
    if (rc)
        fprintf(stderr, "bench_vision: %s\n", err.msg);
    jlm_vtower_close(vt);
    jlm_engine_close(e);
    return rc;
}

int main(int argc, char **argv)
{
    int reps = 20, threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--root") && i + 1 < argc) root = argv[++i];
        else { fprintf(stderr, "usage: bench_vision [-r REPS] [-t THREADS] [--root DIR]\n"); return 2; }
    }
    char dir[] = "/tmp/bench_vision.XXXXXX", path[256], *img_path = NULL;
    if (!mkdtemp(dir))
        return 1;
    snprintf(path, sizeof path, "%s/v.jlm", dir);
    if (asprintf(&img_path, "%s/tests/models/images/shapes-48x40.ppm", root) < 0 || convert(path))
        return 1;
    jlm_image img;
    jlm_err err = {0};
    if (jlm_image_load(img_path, &img, &err)) {
        fprintf(stderr, "bench_vision: %s\n", err.msg);
        return 1;
    }
    jlm_engine_opts o = {.n_threads = threads, .n_ctx = 512, .quiet = 1};
    jlm_engine *e;
    jlm_vtower *vt;
    double ti = 0, tt = 0;
    int rc = jlm_engine_open(path, &o, &e, &err) || jlm_vtower_open(e, &vt, &err);
    if (rc) {
        fprintf(stderr, "bench_vision: %s\n", err.msg);
        return 1;
    }
    rc = time_both(e, vt, &img, reps, &ti, &tt);
    jlm_vtower_close(vt);
    jlm_engine_close(e);
    uint64_t in0, ev0, in1, ev1;
    if (!rc) rc = page_ins(path, 0, &img, 3, &in0, &ev0);
    if (!rc) rc = page_ins(path, 1, &img, 3, &in1, &ev1);
    if (!rc) {
        printf("image encode (256 patches, 4 blocks, -t %d, 0 = all CPUs): %.3f ms = %.1f x one text-token decode (%.3f ms)\n",
               threads, ti * 1e3, ti / tt, tt * 1e3);
        printf("vision page-ins for 3 images: unlimited budget %llu (evictions %llu), one-frame budget %llu (evictions %llu)\n",
               (unsigned long long)in0, (unsigned long long)ev0, (unsigned long long)in1, (unsigned long long)ev1);
    }
    jlm_image_free(&img);
    free(img_path);
    unlink(path);
    rmdir(dir);
    return rc ? 1 : 0;
}

/* vision_map.c - an mmproj GGUF (llama.cpp's clip format) into the vision
 * record and the tower's tensors (roles 64..93, docs/vision.md).
 *
 * Phases: open the mmproj; read its clip.* keys into a jlm_vision; check the
 * projector against the text model; map each tensor name to a role; append
 * the tensors (from_mm) after the text model's. */
#include "converter/convert_int.h"
#include "converter/pack.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- projector types */
/* clip.projector_type -> the vision record's Projector code (jlm-format.md 4.2).
 * Only types with a graph in engine/vision.c are accepted. */
static const struct { const char *name; uint16_t code; } projectors[] = {
    {"gemma3", JLM_PROJ_GEMMA3},
};

static int projector_code(const jlm_gguf *g, uint16_t *out, jlm_err *err)
{
    jlm_gguf_str s;
    if (jlm_gguf_get_str(g, "clip.projector_type", &s, NULL))
        return jlm_errf(err, JLM_EUNSUPPORTED, "%s: no clip.projector_type: not a vision projector (mmproj) file", g->path);
    for (size_t i = 0; i < sizeof projectors / sizeof projectors[0]; i++)
        if (!strcmp(s.s, projectors[i].name)) {
            *out = projectors[i].code;
            return JLM_OK;
        }
    return jlm_errf(err, JLM_EUNSUPPORTED, "%s: projector type '%s' is not supported (supported: gemma3)", g->path, s.s);
}

/* ---------------------------------------------------------------- config */
static int get_f32x3(const jlm_gguf *g, const char *key, float out[3], jlm_err *err)
{
    const jlm_gguf_kv *kv = jlm_gguf_find(g, key);
    if (!kv)
        return JLM_ENOTFOUND;
    if (kv->type != GGUF_T_ARRAY || kv->arr_type != GGUF_T_F32 || kv->n != 3)
        return jlm_errf(err, JLM_EFORMAT, "%s: %s is not an array of 3 f32", g->path, key);
    memcpy(out, kv->arr, 3 * sizeof(float));
    return JLM_OK;
}

static int need_u32(const jlm_gguf *g, const char *key, uint32_t *out, uint32_t max, jlm_err *err)
{
    int rc = jlm_gguf_get_u32(g, key, out, err);
    if (rc == JLM_ENOTFOUND)
        return jlm_errf(err, JLM_EFORMAT, "%s: no %s", g->path, key);
    if (!rc && (*out == 0 || *out > max))
        return jlm_errf(err, JLM_EFORMAT, "%s: %s = %u outside [1, %u]", g->path, key, *out, max);
    return rc;
}

static int read_vision(const jlm_gguf *g, jlm_vision *v, jlm_err *err)
{
    int rc = projector_code(g, &v->projector, err);
    struct { const char *key; uint32_t *dst, max; } dims[] = {
        {"clip.vision.block_count", &v->n_layer, 256},
        {"clip.vision.embedding_length", &v->n_embd, 1 << 16},
        {"clip.vision.attention.head_count", &v->n_head, 1024},
        {"clip.vision.feed_forward_length", &v->n_ffn, 1 << 18},
        {"clip.vision.image_size", &v->image_size, 1 << 14},
        {"clip.vision.patch_size", &v->patch_size, 1024},
        {"clip.vision.projection_dim", &v->proj_dim, 1 << 18},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0] && !rc; i++)
        rc = need_u32(g, dims[i].key, dims[i].dst, dims[i].max, err);
    if (rc)
        return rc;
    if (v->n_embd % v->n_head || v->image_size % v->patch_size)
        return jlm_errf(err, JLM_EFORMAT, "%s: embedding %u not divisible by %u heads, or image %u by patch %u", g->path,
                        v->n_embd, v->n_head, v->image_size, v->patch_size);
    /* llama.cpp's default for gemma3 without the key: 4 (896/14 = 64 -> 16 per side) */
    v->scale = 4;
    if ((rc = jlm_gguf_get_u32(g, "clip.vision.projector.scale_factor", &v->scale, err)) && rc != JLM_ENOTFOUND)
        return rc;
    uint32_t side = v->image_size / v->patch_size;
    if (v->scale == 0 || side % v->scale)
        return jlm_errf(err, JLM_EFORMAT, "%s: pool factor %u does not divide the %u-patch side", g->path, v->scale, side);
    v->eps = 1e-6f;
    if ((rc = jlm_gguf_get_f32(g, "clip.vision.attention.layer_norm_epsilon", &v->eps, err)) && rc != JLM_ENOTFOUND)
        return rc;
    for (int c = 0; c < 3; c++) v->mean[c] = v->std[c] = 0.5f;
    if (((rc = get_f32x3(g, "clip.vision.image_mean", v->mean, err)) && rc != JLM_ENOTFOUND) ||
        ((rc = get_f32x3(g, "clip.vision.image_std", v->std, err)) && rc != JLM_ENOTFOUND))
        return rc;
    for (int c = 0; c < 3; c++)
        if (!(v->std[c] > 0) || v->mean[c] != v->mean[c])
            return jlm_errf(err, JLM_EFORMAT, "%s: image_std/image_mean channel %d is not usable", g->path, c);
    int gelu = 0;
    (void)jlm_gguf_get_bool(g, "clip.use_gelu", &gelu, NULL);
    v->flags = gelu ? JLM_VF_GELU : 0;
    return JLM_OK;
}

/* ---------------------------------------------------------------- tensor names -> roles */
/* v.blk.N.<name>.{weight,bias}, v.<name>.{weight,bias} or mm.<name>.weight:
 * the role (0 if none) and the tower block (-1 outside the blocks). */
static uint16_t vision_role(const char *name, int32_t *block)
{
    char base[96];
    *block = -1;
    const char *p = name;
    if (!strncmp(p, "v.blk.", 6)) {
        char *end;
        long b = strtol(p + 6, &end, 10);
        if (end == p + 6 || *end != '.' || b < 0 || b > 255)
            return 0;
        *block = (int32_t)b;
        p = end + 1;
    }
    size_t n = strlen(p);
    int bias = n > 5 && !strcmp(p + n - 5, ".bias");
    if (!bias && !(n > 7 && !strcmp(p + n - 7, ".weight")))
        return 0;
    n -= bias ? 5 : 7;
    if (n >= sizeof base)
        return 0;
    memcpy(base, p, n);
    base[n] = 0;
    if (bias)
        strcat(base, ".bias");
    for (uint16_t r = JLM_R_VISION_FIRST; r <= JLM_R_VISION_LAST; r++) {
        const char *rn = jlm_fmt_vision_role_name(r);
        int in_block = rn && strncmp(rn, "v.", 2) && strncmp(rn, "mm.", 3);
        if (rn && !strcmp(rn, base) && in_block == (*block >= 0))
            return r;
    }
    return 0;
}

/* ---------------------------------------------------------------- checks against the text model */
static int check_fit(const jlm_conv *c, const jlm_gguf *g, jlm_err *err)
{
    const jlm_gguf_tensor *pj = jlm_gguf_find_tensor(g, "mm.input_projection.weight");
    if (!pj || pj->n_dims != 2)
        return jlm_errf(err, JLM_EFORMAT, "%s: gemma3 projector without a 2-D mm.input_projection.weight", g->path);
    /* gemma3: out = x @ W with W numpy (in, out): ne[0] is the output width */
    if (pj->ne[1] != c->vision.n_embd)
        return jlm_errf(err, JLM_EFORMAT, "%s: mm.input_projection takes %llu inputs, the tower is %u wide", g->path,
                        (unsigned long long)pj->ne[1], c->vision.n_embd);
    if (pj->ne[0] != c->config.n_embd)
        return jlm_errf(err, JLM_EFORMAT, "%s: projector output %llu does not match %s's n_embd %u: an mmproj for another text model",
                        g->path, (unsigned long long)pj->ne[0], c->src_path, c->config.n_embd);
    if (c->config.arch != JLM_ARCH_GEMMA3)
        return jlm_errf(err, JLM_EUNSUPPORTED, "%s: a gemma3 projector needs a gemma3 text model, %s is %s", g->path,
                        c->src_path, jlm_fmt_arch_name(c->config.arch));
    return JLM_OK;
}

/* ---------------------------------------------------------------- append the tower's tensors */
static int map_one(jlm_conv *c, const jlm_gguf *g, uint32_t gi, jlm_tensor *t, jlm_conv_src *s, FILE *notes,
                   jlm_err *err)
{
    const jlm_gguf_tensor *gt = &g->tensors[gi];
    int32_t block;
    uint16_t role = vision_role(gt->name.s, &block);
    if (!role)
        return jlm_errf(err, JLM_EUNSUPPORTED, "%s: tensor '%s' has no vision role", g->path, gt->name.s);
    if (block >= (int32_t)c->vision.n_layer)
        return jlm_errf(err, JLM_EFORMAT, "%s: tensor '%s' is in block %d of %u", g->path, gt->name.s, block,
                        c->vision.n_layer);
    int exact, rc = jlm_pack_stored_type(gt->type, &t->type, &exact, err);
    if (rc)
        return jlm_err_prefix(err, rc, "%s: tensor '%s'", g->path, gt->name.s);
    if (!exact && notes)
        fprintf(notes, "note: %s: tensor '%s' is %s, stored as %s (re-quantized)\n", g->path, gt->name.s,
                jlm_ggml_type_name(gt->type), jlm_fmt_type_traits(t->type)->name);
    t->role = role;
    t->block = block;
    t->index = -1;
    t->ndim = (uint8_t)(gt->n_dims ? gt->n_dims : 1);
    for (int d = 0; d < 4; d++)
        t->dims[d] = gt->ne[d] ? gt->ne[d] : 1;
    t->name.s = gt->name.s;
    t->name.len = (uint32_t)gt->name.len;
    *s = (jlm_conv_src){.gguf_idx = gi, .src_type = gt->type, .exact = exact, .from_mm = 1};
    return JLM_OK;
}

int jlm_conv_map_vision(jlm_conv *c, int root_fd, const char *mm_path, FILE *notes, jlm_err *err)
{
    int rc = jlm_gguf_open_at(root_fd, mm_path, &c->mm, err);
    if (rc)
        return rc;
    const jlm_gguf *g = c->mm;
    if ((rc = read_vision(g, &c->vision, err)) || (rc = check_fit(c, g, err)))
        return rc;
    uint64_t n = c->n_tensors + g->n_tensors;
    jlm_tensor *ts = jlm_arena_alloc(c->arena, n * sizeof *ts);
    jlm_conv_src *ss = jlm_arena_alloc(c->arena, n * sizeof *ss);
    if (!ts || !ss)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", g->path);
    memcpy(ts, c->tensors, c->n_tensors * sizeof *ts);
    memcpy(ss, c->src, c->n_tensors * sizeof *ss);
    for (uint32_t i = 0; i < g->n_tensors && !rc; i++)
        rc = map_one(c, g, i, &ts[c->n_tensors + i], &ss[c->n_tensors + i], notes, err);
    if (rc)
        return rc;
    c->tensors = ts;
    c->src = ss;
    c->n_tensors = (uint32_t)n;
    return JLM_OK;
}

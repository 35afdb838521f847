/* cmd_info.c - `jlm info MODEL [--tensors] [--json]`: header, config, page
 * arrays, vocab summary, fingerprint and (optionally) the tensor table. */
#include "cli/backend.h"
#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/report.h"
#include "converter/convert.h"
#include "converter/hf.h"
#include "format/jlm_format.h"

#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *vocab_kind(uint8_t k)
{
    static const char *n[] = {"none", "spm", "bpe", "wpm", "spbpe"};
    return k < 5 ? n[k] : "?";
}

static json_t *tensors_json(const jlm_model *m)
{
    json_t *a = json_array();
    for (uint32_t i = 0; i < m->hdr.n_tensors; i++) {
        const jlm_tensor *t = &m->tensors[i];
        json_t *dims = json_array();
        for (int d = 0; d < t->ndim; d++)
            json_array_append_new(dims, json_integer((json_int_t)t->dims[d]));
        jlm_tensor_loc l;
        jlm_fmt_tensor_loc(m, t, &l);
        static const char *rn[] = {"dense", "text", "vision", "expert"};
        json_array_append_new(a, json_pack("{s:s, s:i, s:i, s:i, s:s, s:o, s:s, s:I, s:I, s:I, s:I}",
            "name", t->name.s, "role", t->role, "block", t->block, "index", t->index,
            "type", jlm_fmt_type_traits(t->type)->name, "dims", dims, "region", rn[l.region],
            "page", (json_int_t)l.page, "qs_off", (json_int_t)t->qs_off, "d_off", (json_int_t)t->d_off,
            "sc_off", (json_int_t)t->sc_off));
    }
    return a;
}

static json_t *info_json(const jlm_model *m, int with_tensors)
{
    const jlm_header *h = &m->hdr;
    const jlm_config *c = &m->config;
    json_t *o = json_pack("{s:s, s:i, s:I}", "path", m->path, "version", h->version, "file_size", (json_int_t)m->file_size);
    json_object_set_new(o, "header", json_pack("{s:I, s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:i, s:I, s:I, s:I, s:i, s:I, s:i}",
        "page_size", (json_int_t)h->page_size, "n_blocks", h->n_blocks, "n_tensors", h->n_tensors,
        "data_off", (json_int_t)h->data_off, "dense_off", (json_int_t)h->dense_off, "dense_len", (json_int_t)h->dense_len,
        "vis_data_off", (json_int_t)h->vis_data_off, "vis_page_size", (json_int_t)h->vis_page_size,
        "n_vis_blocks", h->n_vis_blocks, "chunk", (json_int_t)h->chunk, "exp_data_off", (json_int_t)h->exp_data_off,
        "exp_page_size", (json_int_t)h->exp_page_size, "n_exp_pages", h->n_exp_pages,
        "meta_len", (json_int_t)h->dense_off, "stream_groups", h->stream_groups));
    json_object_set_new(o, "config", json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:i}",
        "arch", jlm_fmt_arch_name(c->arch), "n_layer", c->n_layer, "n_embd", c->n_embd, "n_head", c->n_head,
        "n_kv_head", c->n_kv_head, "head_dim", c->head_dim, "n_rot", c->n_rot, "n_ffn", c->n_ffn,
        "n_vocab", c->n_vocab, "n_ctx", c->n_ctx, "n_expert", c->n_expert, "n_expert_used", c->n_expert_used,
        "n_ffn_exp", c->n_ffn_exp, "swa_window", c->swa_window, "swa_period", c->swa_period,
        "rms_eps", (double)c->rms_eps, "rope_base", (double)c->rope_base, "rope_base_swa", (double)c->rope_base_swa,
        "flags", c->flags));
    json_t *cj = json_object_get(o, "config");
    json_object_update_new(cj, json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:i, s:f, s:f, s:i, s:f, s:i, s:f}",
        "head_dim_v", c->head_dim_v, "n_ffn_shexp", c->n_ffn_shexp, "n_dense_lead", c->n_dense_lead,
        "q_lora_rank", c->q_lora_rank, "kv_lora_rank", c->kv_lora_rank, "n_expert_group", c->n_expert_group,
        "n_expert_group_used", c->n_expert_group_used, "expert_scale", (double)c->expert_scale,
        "moe_step", c->moe_step, "attn_temp_scale", (double)c->attn_temp_scale, "yarn_factor", (double)c->yarn_factor,
        "yarn_orig_ctx", c->yarn_orig_ctx, "yarn_log_mul", (double)c->yarn_log_mul, "attn_temp_floor",
        c->attn_temp_floor, "attn_temp_offset", (double)c->attn_temp_offset));
    json_object_set_new(o, "vocab", json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:s, s:i}",
        "kind", vocab_kind(m->vocab.kind), "n_tokens", m->vocab.n_tokens, "n_merges", m->vocab.n_merges,
        "bos", m->vocab.bos, "eos", m->vocab.eos, "n_added", m->vocab.n_added, "pre", m->vocab.pre_name.s,
        "n_templates", m->vocab.n_templates));
    json_object_set_new(o, "backends", jlm_cli_backends_json());
    json_object_set_new(o, "fingerprint", json_pack("{s:s, s:s, s:s, s:I}", "host", m->fp.host.s,
        "device", m->fp.device.s, "writer", m->fp.writer.s, "vram", (json_int_t)m->fp.vram));
    if (m->has_vision) {
        const jlm_vision *v = &m->vision;
        json_object_set_new(o, "vision", json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:[f,f,f], s:[f,f,f], s:i}",
            "projector", v->projector, "n_layer", v->n_layer, "n_embd", v->n_embd, "n_head", v->n_head, "n_ffn", v->n_ffn,
            "image_size", v->image_size, "patch_size", v->patch_size, "proj_dim", v->proj_dim, "scale", v->scale,
            "eps", (double)v->eps, "mean", (double)v->mean[0], (double)v->mean[1], (double)v->mean[2],
            "std", (double)v->std[0], (double)v->std[1], (double)v->std[2], "flags", v->flags));
    }
    if (with_tensors)
        json_object_set_new(o, "tensors", tensors_json(m));
    return o;
}

/* src_size: 0 for a container; else m is the plan of a GGUF or Hugging
 * Face source of that many bytes, read without converting it. */
static void info_text(const jlm_model *m, int with_tensors, uint64_t src_size)
{
    const jlm_header *h = &m->hdr;
    const jlm_config *c = &m->config;
    if (src_size)
        printf("%s: %s source, %llu bytes, not converted; as a jlm container (version %u): %llu bytes\n",
               jlm_cli_clean(m->path), jlm_cli_is_gguf(m->path) ? "GGUF" : "Hugging Face", (unsigned long long)src_size,
               h->version, (unsigned long long)m->file_size);
    else
        printf("%s: jlm container version %u, %llu bytes\n", jlm_cli_clean(m->path), h->version,
               (unsigned long long)m->file_size);
    printf("  arch          %s\n", jlm_fmt_arch_name(c->arch));
    printf("  dims          n_layer %u, n_embd %u, n_head %u, n_kv_head %u, head_dim %u, n_rot %u, n_ffn %u\n",
           c->n_layer, c->n_embd, c->n_head, c->n_kv_head, c->head_dim, c->n_rot, c->n_ffn);
    printf("  vocab/ctx     n_vocab %u, n_ctx %u\n", c->n_vocab, c->n_ctx);
    if (c->n_expert)
        printf("  experts       %u, %u used, n_ffn_exp %u\n", c->n_expert, c->n_expert_used, c->n_ffn_exp);
    if (c->n_expert || c->n_ffn_shexp || c->n_dense_lead)
        printf("  routing       %s, %s, scale %g, groups %u (%u kept), shared expert n_ffn %u, leading dense %u, "
               "moe every %u\n", (c->flags & JLM_F_EXPERT_SIGMOID) ? "sigmoid" : "softmax",
               (c->flags & JLM_F_NO_EXPERT_NORM) ? "weights not normalised" : "weights normalised",
               (double)(c->expert_scale ? c->expert_scale : 1.0f), c->n_expert_group, c->n_expert_group_used,
               c->n_ffn_shexp, c->n_dense_lead, c->moe_step ? c->moe_step : 1);
    if (c->kv_lora_rank)
        printf("  latent attn   q_lora %u, kv_lora %u, rope part %u, head_dim k %u / v %u; KV cache %u values a "
               "token a layer\n", c->q_lora_rank, c->kv_lora_rank, c->n_rot, c->head_dim,
               c->head_dim_v ? c->head_dim_v : c->head_dim, c->kv_lora_rank + c->n_rot);
    if (c->arch == JLM_ARCH_DEEPSEEK2 && !c->kv_lora_rank)
        printf("  nextn/mtp     not stored (the NextN blocks of the source, if any, are not run)\n");
    if (c->attn_temp_scale)
        printf("  attn temp     scale %g, floor %u, offset %g\n", (double)c->attn_temp_scale, c->attn_temp_floor,
               (double)c->attn_temp_offset);
    if (c->swa_window)
        printf("  sliding win   %u, period %u\n", c->swa_window, c->swa_period);
    printf("  rope          base %g, base_swa %g, yarn factor %g", (double)c->rope_base, (double)c->rope_base_swa,
           (double)c->yarn_factor);
    if (c->yarn_factor)
        printf(" (orig ctx %u, beta fast %g / slow %g, log mul %g)", c->yarn_orig_ctx, (double)c->yarn_beta_fast,
               (double)c->yarn_beta_slow, (double)c->yarn_log_mul);
    printf("\n");
    printf("  rms_eps       %g\n  flags         0x%08x\n", (double)c->rms_eps, c->flags);
    printf("  metadata      %llu bytes; dense region %llu bytes at %llu\n", (unsigned long long)h->dense_off,
           (unsigned long long)h->dense_len, (unsigned long long)h->dense_off);
    printf("  text pages    %u x %llu bytes at %llu\n", h->n_blocks, (unsigned long long)h->page_size, (unsigned long long)h->data_off);
    if (h->n_vis_blocks)
        printf("  vision pages  %u x %llu bytes at %llu\n", h->n_vis_blocks, (unsigned long long)h->vis_page_size,
               (unsigned long long)h->vis_data_off);
    if (m->has_vision) {
        const jlm_vision *v = &m->vision;
        printf("  vision tower  projector %u, %u blocks, n_embd %u, %u heads, n_ffn %u, image %u, patch %u, pool %u, "
               "eps %g, flags 0x%x\n", v->projector, v->n_layer, v->n_embd, v->n_head, v->n_ffn, v->image_size,
               v->patch_size, v->scale, (double)v->eps, v->flags);
    }
    if (h->n_exp_pages)
        printf("  expert pages  %u x %llu bytes at %llu\n", h->n_exp_pages, (unsigned long long)h->exp_page_size,
               (unsigned long long)h->exp_data_off);
    printf("  chunk         %llu, stream groups %u\n", (unsigned long long)h->chunk, h->stream_groups);
    printf("  tokenizer     %s, %u tokens, %u merges, bos %d, eos %d, pre '%s', %u chat template(s)\n",
           vocab_kind(m->vocab.kind), m->vocab.n_tokens, m->vocab.n_merges, m->vocab.bos, m->vocab.eos,
           jlm_cli_clean(m->vocab.pre_name.s), m->vocab.n_templates);
    printf("  fingerprint   host %s, device %s, writer %s\n", jlm_cli_clean(m->fp.host.s),
           jlm_cli_clean(m->fp.device.s), jlm_cli_clean(m->fp.writer.s));
    if (!with_tensors)
        return;
    printf("  %-32s %5s %5s %-6s %-22s %-7s %5s %12s\n", "tensor", "role", "block", "type", "dims", "region", "page", "qs_off");
    for (uint32_t i = 0; i < h->n_tensors; i++) {
        const jlm_tensor *t = &m->tensors[i];
        char dims[64] = "";
        for (int d = 0; d < t->ndim; d++)
            snprintf(dims + strlen(dims), sizeof dims - strlen(dims), d ? "x%llu" : "%llu", (unsigned long long)t->dims[d]);
        jlm_tensor_loc l;
        jlm_fmt_tensor_loc(m, t, &l);
        static const char *rn[] = {"dense", "text", "vision", "expert"};
        printf("  %-32s %5u %5d %-6s %-22s %-7s %5lld %12llu\n", jlm_cli_clean(t->name.s), t->role, t->block,
               jlm_fmt_type_traits(t->type)->name, dims, rn[l.region], (long long)l.page, (unsigned long long)t->qs_off);
    }
}

/* The size on disk of a GGUF (its first file) or a Hugging Face folder's
 * *.safetensors and *.json files (du's apparent size). */
static uint64_t source_size(const char *path)
{
    struct stat st;
    if (stat(path, &st))
        return 1;
    if (!S_ISDIR(st.st_mode))
        return (uint64_t)st.st_size;
    uint64_t sum = 0;
    DIR *d = opendir(path);
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (de->d_name[0] != '.' && fstatat(dirfd(d), de->d_name, &st, 0) == 0 && S_ISREG(st.st_mode))
            sum += (uint64_t)st.st_size;
    if (d)
        closedir(d);
    return sum ? sum : 1;
}

/* A GGUF or a Hugging Face folder: the container it would become, planned
 * from its header and tensor table alone (convert.h invariant 1: no weight
 * byte read, no cache entry made). */
static int info_source(const char *path, int tensors, int js)
{
    jlm_err err = {0};
    jlm_conv *c = NULL;
    if (jlm_conv_open(path, NULL, &c, &err)) {
        jlm_cli_error("jlm info", err.msg);
        return 1;
    }
    jlm_model m = {.path = (char *)path, .fd = -1, .file_size = c->plan.file_size, .hdr = c->plan.hdr,
                   .config = c->config, .vision = c->vision, .has_vision = c->mm != NULL, .vocab = c->vocab,
                   .fp = c->fp, .tensors = c->plan.tensors};
    uint64_t size = source_size(path);
    if (js) {
        json_t *o = info_json(&m, tensors);
        json_object_set_new(o, "source", json_pack("{s:s, s:I, s:b}", "kind", jlm_cli_is_gguf(path) ? "gguf" : "hf",
                                                    "size", (json_int_t)size, "converted", 0));
        char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        puts(s);
        free(s);
        json_decref(o);
    } else {
        info_text(&m, tensors, size);
    }
    jlm_conv_close(c);
    return 0;
}

static const char INFO_USAGE[] = "usage: jlm info MODEL [--tensors] [--json] [--html [-o FILE] [--db DB --key KEY]]\n";

int jlm_cmd_info(int argc, char **argv)
{
    const char *path = NULL, *out = NULL, *db = NULL, *key = NULL;
    const char *m_opt = NULL;
    int tensors = 0, js = 0, html = 0;
    const jlm_opt t[] = {
        {"-m", "--model", JLM_OPT_STR, &m_opt, 0, 0, 0, "FILE", "the model (or give it first)"},
        {NULL, "--tensors", JLM_OPT_FLAG, &tensors, 0, 0, 0, NULL, "list every tensor"},
        {NULL, "--json", JLM_OPT_FLAG, &js, 0, 0, 0, NULL, "JSON on stdout"},
        {NULL, "--html", JLM_OPT_FLAG, &html, 0, 0, 0, NULL, "the container picture as HTML"},
        {"-o", "--output", JLM_OPT_STR, &out, 0, 0, JLM_OPT_OUT, "FILE", "--html: write to FILE (default: stdout)"},
        {NULL, "--db", JLM_OPT_STR, &db, 0, 0, 0, "DB", "--html: residency database to overlay"},
        {NULL, "--key", JLM_OPT_STR, &key, 0, 0, 0, "KEY", "--html: the model's key in DB"},
    };
    const char *pos[1] = {0};
    jlm_opts_spec os = {"jlm info", "MODEL [options]", t, (int)(sizeof t / sizeof t[0]), pos, 1, 0};
    int prc = jlm_opts_parse(&os, argc, argv);
    if (prc)
        return prc == 1 ? 0 : prc;
    if (os.n_pos && m_opt)
        return jlm_cli_error("jlm info", "give the model once: as MODEL or as -m"), 2;
    path = os.n_pos ? pos[0] : m_opt;
    if (!path || ((out || db || key) && !html) || !db != !key || (html && js)) {
        fputs(INFO_USAGE, stderr);
        return 2;
    }
    if (!html && (jlm_cli_is_gguf(path) || jlm_hf_is_folder(path)))
        return info_source(path, tensors, js);
    if (!(path = jlm_cli_resolve_model("jlm info", path)))
        return 1;
    if (html)
        return jlm_cli_picture("jlm info", path, out, db, key);
    jlm_err err = {0};
    jlm_model *m = NULL;
    char *file = jlm_cli_container_path(path);   /* a view directory: its model.jlm */
    int orc = file ? jlm_fmt_open(file, &m, &err) : jlm_errf(&err, JLM_ENOMEM, "out of memory");
    free(file);
    if (orc) {
        jlm_cli_error("jlm info", err.msg);
        return 1;
    }
    if (js) {
        json_t *o = info_json(m, tensors);
        char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        puts(s);
        free(s);
        json_decref(o);
    } else {
        info_text(m, tensors, 0);
    }
    jlm_fmt_close(m);
    return 0;
}

/* picture.c - the page's data (regions, page arrays, tensors, residency) as
 * JSON, and the HTML around it: the region bars at two scales and the region
 * table are drawn here, the grids and panels by the embedded script
 * (picture/page.js) from the JSON. See picture.h for the invariants. */
#include "picture/picture.h"
#include "residency/residency.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <utf8proc.h>

/* page.css and page.js as C strings (generated at build time, see Makefile) */
#include "picture/picture_assets.h"

/* ---------------------------------------------------------------- regions */
void jlm_pic_regions(const jlm_model *m, jlm_pic_region out[JLM_PIC_N_REGIONS])
{
    const jlm_header *h = &m->hdr;
    const jlm_pic_region r[JLM_PIC_N_REGIONS] = {
        {"header", "header", 0, JLM_HEADER_LEN, 1},
        {"config", "config", h->cfg_off, h->cfg_len, 1},
        {"vision-record", "vision record", h->vis_off, h->vis_len, 1},
        {"vocab", "vocab", h->voc_off, h->voc_len, 1},
        {"table", "tensor table", h->tab_off, h->tab_len, 1},
        {"fingerprint", "fingerprint", h->fp_off, h->fp_len, 1},
        {"dense", "dense region", h->dense_off, h->dense_len, JLM_ALIGN},
        {"text", "text pages", h->data_off, (uint64_t)h->n_blocks * h->page_size, JLM_ALIGN},
        {"vision", "vision pages", h->vis_data_off, (uint64_t)h->n_vis_blocks * h->vis_page_size, JLM_ALIGN},
        {"experts", "expert pages", h->exp_data_off, (uint64_t)h->n_exp_pages * h->exp_page_size, JLM_ALIGN},
    };
    memcpy(out, r, sizeof r);
}

/* ---------------------------------------------------------------- JSON helpers */
/* A JSON string from container bytes: invalid UTF-8 becomes U+FFFD (jansson
 * refuses invalid UTF-8, and a hostile container may hold any bytes). */
static json_t *jstr(const char *s, size_t len)
{
    if (!s)
        return json_string("");
    char *buf = malloc(len * 3 + 1);
    if (!buf)
        return NULL;
    size_t o = 0, i = 0;
    while (i < len) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t n = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &cp);
        if (n <= 0) {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += 1;
        } else {
            memcpy(buf + o, s + i, (size_t)n);
            o += (size_t)n;
            i += (size_t)n;
        }
    }
    json_t *j = json_stringn(buf, o);
    free(buf);
    return j;
}

static json_t *jls(jlm_str s) { return jstr(s.s, s.len); }
static json_t *ju(uint64_t v) { return json_integer((json_int_t)v); }

/* ---------------------------------------------------------------- data: records */
static json_t *header_json(const jlm_header *h)
{
    return json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
        "version", ju(h->version), "page_size", ju(h->page_size), "n_blocks", ju(h->n_blocks),
        "n_tensors", ju(h->n_tensors), "data_off", ju(h->data_off), "dense_off", ju(h->dense_off),
        "dense_len", ju(h->dense_len), "vis_data_off", ju(h->vis_data_off), "vis_page_size", ju(h->vis_page_size),
        "n_vis_blocks", ju(h->n_vis_blocks), "chunk", ju(h->chunk), "stream_groups", ju(h->stream_groups),
        "n_exp_pages", ju(h->n_exp_pages), "exp_data_off", ju(h->exp_data_off),
        "exp_page_size", ju(h->exp_page_size), "meta_len", ju(h->dense_off));
}

static json_t *config_json(const jlm_config *c)
{
    const char *arch = jlm_fmt_arch_name(c->arch);
    return json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:i}",
        "arch", arch ? arch : "?", "n_layer", c->n_layer, "n_embd", c->n_embd, "n_head", c->n_head,
        "n_kv_head", c->n_kv_head, "head_dim", c->head_dim, "n_rot", c->n_rot, "n_ffn", c->n_ffn,
        "n_vocab", c->n_vocab, "n_ctx", c->n_ctx, "n_expert", c->n_expert, "n_expert_used", c->n_expert_used,
        "n_ffn_exp", c->n_ffn_exp, "n_ffn_shexp", c->n_ffn_shexp, "swa_window", c->swa_window,
        "swa_period", c->swa_period, "rms_eps", (double)c->rms_eps, "rope_base", (double)c->rope_base,
        "rope_base_swa", (double)c->rope_base_swa, "flags", c->flags);
}

static json_t *vision_json(const jlm_model *m)
{
    if (!m->has_vision)
        return json_null();
    const jlm_vision *v = &m->vision;
    return json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:i, s:i}",
        "n_layer", v->n_layer, "n_embd", v->n_embd, "n_head", v->n_head, "n_ffn", v->n_ffn,
        "image_size", v->image_size, "patch_size", v->patch_size, "proj_dim", v->proj_dim, "scale", v->scale,
        "eps", (double)v->eps, "projector", v->projector, "flags", v->flags);
}

static json_t *vocab_json(const jlm_vocab *v)
{
    static const char *kinds[] = {"none", "spm", "bpe", "wpm", "spbpe"};
    json_t *names = json_array();
    for (uint32_t i = 0; i < v->n_templates; i++)
        json_array_append_new(names, jls(v->templates[2 * i]));
    return json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:o, s:o}", "kind", v->kind < 5 ? kinds[v->kind] : "?",
        "n_tokens", v->n_tokens, "n_merges", v->n_merges, "n_added", v->n_added, "bos", v->bos, "eos", v->eos,
        "pre", jls(v->pre_name), "templates", names);
}

static json_t *fingerprint_json(const jlm_fingerprint *f)
{
    return json_pack("{s:o, s:o, s:o, s:o}", "host", jls(f->host), "device", jls(f->device),
                     "writer", jls(f->writer), "vram", ju(f->vram));
}

static json_t *regions_json(const jlm_model *m)
{
    jlm_pic_region r[JLM_PIC_N_REGIONS];
    jlm_pic_regions(m, r);
    json_t *a = json_array();
    for (int i = 0; i < JLM_PIC_N_REGIONS; i++)
        json_array_append_new(a, json_pack("{s:s, s:s, s:o, s:o, s:o}", "id", r[i].id, "label", r[i].label,
                                           "off", ju(r[i].off), "len", ju(r[i].len), "align", ju(r[i].align)));
    return a;
}

/* ---------------------------------------------------------------- data: tensors and page arrays */
static json_t *tensor_json(const jlm_model *m, const jlm_tensor *t)
{
    static const char *rn[] = {"dense", "text", "vision", "experts"};
    jlm_tensor_loc l;
    jlm_fmt_tensor_loc(m, t, &l);
    jlm_tensor_planes pl = {0};
    jlm_fmt_tensor_planes(t, &pl, NULL);   /* cannot fail for a decoded model (invariant 1 of jlm_format.h) */
    int bank = l.region == JLM_REG_EXPERT && t->index < 0;
    json_t *dims = json_array();
    for (int d = 0; d < t->ndim; d++)
        json_array_append_new(dims, ju(t->dims[d]));
    const char *role = jlm_fmt_role_name(t->role);
    return json_pack("{s:o, s:i, s:s, s:i, s:i, s:s, s:o, s:s, s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:o}",
        "name", jls(t->name), "role", t->role, "role_name", role ? role : "?", "block", t->block,
        "index", t->index, "type", jlm_fmt_type_traits(t->type)->name, "dims", dims, "region", rn[l.region],
        "page", (json_int_t)l.page, "npages", (json_int_t)(bank ? m->config.n_expert : 1),
        "qs_off", ju(t->qs_off), "d_off", ju(t->d_off), "sc_off", ju(t->sc_off),
        "qs_len", ju(bank ? pl.sheet_qs : pl.qs_len), "d_len", ju(bank ? pl.sheet_d : pl.d_len),
        "sc_len", ju(bank ? pl.sheet_sc : pl.sc_len));
}

/* One page array: base, page size, count and every page's extent as the
 * engine's pager gets it (engine/pager.c: jlm_fmt_page_extent per page). */
static json_t *array_json(const jlm_model *m, int region, uint64_t base, uint64_t size, uint32_t n)
{
    json_t *ext = json_array();
    for (uint32_t i = 0; i < n; i++)
        json_array_append_new(ext, ju(jlm_fmt_page_extent(m, region, i)));
    return json_pack("{s:o, s:o, s:o, s:o}", "base", ju(n ? base : 0), "page_size", ju(size), "n", ju(n),
                     "extents", ext);
}

static json_t *arrays_json(const jlm_model *m)
{
    const jlm_header *h = &m->hdr;
    json_t *e = array_json(m, JLM_REG_EXPERT, h->exp_data_off, h->exp_page_size, h->n_exp_pages);
    json_object_set_new(e, "n_expert", ju(m->config.n_expert));
    return json_pack("{s:o, s:o, s:o}",
        "text", array_json(m, JLM_REG_TEXT, h->data_off, h->page_size, h->n_blocks),
        "vision", array_json(m, JLM_REG_VISION, h->vis_data_off, h->vis_page_size, h->n_vis_blocks),
        "experts", e);
}

/* ---------------------------------------------------------------- data: residency overlay */
/* The model's resident pages and counters, as the database has them now. */
static int residency_json(const jlm_pic_overlay *ov, json_t **out, jlm_err *err)
{
    jlm_rdb *db = ov->db;
    char **names = NULL, *stats = NULL;
    size_t n = 0;
    int e = db ? 0 : jlm_rdb_open(ov->db_path, JLM_RDB_READONLY, &db, err);
    if (!e)
        e = jlm_rdb_resident(db, ov->model_key, &names, &n, err);
    if (!e)
        e = jlm_rdb_stats_json(db, ov->model_key, &stats, err);
    if (db != ov->db)
        jlm_rdb_close(db);
    if (e) {
        jlm_rdb_free_names(names, n);
        return e;
    }
    json_t *res = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(res, jstr(names[i], strlen(names[i])));
    jlm_rdb_free_names(names, n);
    json_t *all = json_loads(stats, 0, NULL);
    free(stats);
    json_t *model = json_object_get(json_object_get(all, "models"), ov->model_key);
    char when[32];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    *out = json_pack("{s:s, s:o, s:O, s:O, s:O}", "as_of", when, "resident", res, "pages",
                     model ? json_object_get(model, "pages") : json_null(), "totals",
                     model ? json_object_get(model, "totals") : json_null(), "sessions",
                     model ? json_object_get(model, "sessions") : json_null());
    json_decref(all);
    if (!*out)
        return jlm_errf(err, JLM_ENOMEM, "%s: residency overlay: out of memory", ov->model_key);
    return 0;
}

/* ---------------------------------------------------------------- data: the whole object */
/* Writes s with '<', '>', '&' as \u escapes (invariant 2): inside a JSON text
 * they can only occur within strings, where the escape means the same. */
static void put_json_safe(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '<') fputs("\\u003c", f);
        else if (*s == '>') fputs("\\u003e", f);
        else if (*s == '&') fputs("\\u0026", f);
        else fputc(*s, f);
    }
}

int jlm_pic_data_json(const jlm_model *m, const jlm_pic_overlay *ov, char **out, jlm_err *err)
{
    json_t *res = json_null();
    if (ov) {
        int e = residency_json(ov, &res, err);
        if (e)
            return e;
    }
    json_t *tensors = json_array();
    for (uint32_t i = 0; i < m->hdr.n_tensors; i++)
        json_array_append_new(tensors, tensor_json(m, &m->tensors[i]));
    json_t *o = json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
        "path", jstr(m->path, strlen(m->path)), "file_size", ju(m->file_size), "regions", regions_json(m),
        "header", header_json(&m->hdr), "config", config_json(&m->config), "vision_record", vision_json(m),
        "vocab", vocab_json(&m->vocab), "fingerprint", fingerprint_json(&m->fp), "arrays", arrays_json(m),
        "tensors", tensors, "residency", res);
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = s ? open_memstream(&buf, &len) : NULL;
    if (f) {
        put_json_safe(f, s);
        if (fclose(f))
            buf = NULL;   /* open_memstream frees nothing on failure: len is 0 */
    }
    free(s);
    if (!buf)
        return jlm_errf(err, JLM_ENOMEM, "%s: picture: out of memory", m->path);
    *out = buf;
    return 0;
}

/* ---------------------------------------------------------------- HTML */
static void put_html(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&#39;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* Width of each region on the not-to-scale bar: a floor so the header can be
 * selected, plus the log of the length so larger still reads larger. */
static double wide_weight(uint64_t len) { return 8.0 + log2((double)len + 1.0); }

#define BAR_W 1000.0

static void bar_rect(FILE *f, const jlm_pic_region *r, double x, double w)
{
    fprintf(f, "<a href=\"#region=%s\"><rect class=\"reg r-%s\" data-region=\"%s\" x=\"%.3f\" y=\"0\" "
               "width=\"%.3f\" height=\"32\"><title>%s: %llu bytes at %llu</title></rect>", r->id, r->id, r->id,
            x, w, r->label, (unsigned long long)r->len, (unsigned long long)r->off);
    if (w > 40)
        fprintf(f, "<text x=\"%.3f\" y=\"20\">%s</text>", x + 4, r->label);
    fputs("</a>", f);
}

/* The file in order: true to size (padding shown as gaps), then not to scale. */
static void put_bars(FILE *f, const jlm_model *m, const jlm_pic_region *r)
{
    double total = (double)(m->file_size ? m->file_size : 1), wsum = 0;
    fputs("<figure class=\"bar\"><figcaption>true to size</figcaption>"
          "<svg id=\"bar-true\" viewBox=\"0 0 1000 32\" preserveAspectRatio=\"none\">"
          "<rect class=\"pad\" x=\"0\" y=\"0\" width=\"1000\" height=\"32\"><title>padding</title></rect>", f);
    for (int i = 0; i < JLM_PIC_N_REGIONS; i++)
        if (r[i].len)
            bar_rect(f, &r[i], BAR_W * (double)r[i].off / total, BAR_W * (double)r[i].len / total);
    fputs("</svg></figure><figure class=\"bar\"><figcaption>not to scale</figcaption>"
          "<svg id=\"bar-wide\" viewBox=\"0 0 1000 32\" preserveAspectRatio=\"none\">", f);
    for (int i = 0; i < JLM_PIC_N_REGIONS; i++)
        if (r[i].len)
            wsum += wide_weight(r[i].len);
    double x = 0;
    for (int i = 0; i < JLM_PIC_N_REGIONS; i++) {
        if (!r[i].len)
            continue;
        double w = BAR_W * wide_weight(r[i].len) / wsum;
        bar_rect(f, &r[i], x, w);
        x += w;
    }
    fputs("</svg></figure>\n", f);
}

/* Every region with its offset, length and alignment, in plain decimal bytes
 * (readable without the script; the script marks the selected row). */
static void put_region_table(FILE *f, const jlm_pic_region *r)
{
    fputs("<table id=\"regions\"><thead><tr><th>region</th><th>offset</th><th>length</th><th>end</th>"
          "<th>alignment</th></tr></thead><tbody>\n", f);
    for (int i = 0; i < JLM_PIC_N_REGIONS; i++)
        fprintf(f, "<tr id=\"row-%s\" class=\"%s\"><td><a href=\"#region=%s\">%s</a></td><td class=\"off\">%llu</td>"
                   "<td class=\"len\">%llu</td><td class=\"end\">%llu</td><td class=\"align\">%llu</td></tr>\n",
                r[i].id, r[i].len ? "present" : "absent", r[i].id, r[i].label, (unsigned long long)r[i].off,
                (unsigned long long)r[i].len, (unsigned long long)(r[i].off + r[i].len),
                (unsigned long long)r[i].align);
    fputs("</tbody></table>\n", f);
}

static void put_page(FILE *f, const jlm_model *m, const char *title, const char *data)
{
    jlm_pic_region r[JLM_PIC_N_REGIONS];
    jlm_pic_regions(m, r);
    const char *arch = jlm_fmt_arch_name(m->config.arch);
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
          "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>", f);
    put_html(f, title);
    fprintf(f, "</title>\n<style>\n%s</style></head>\n<body>\n<header><h1>", PICTURE_PAGE_CSS);
    put_html(f, title);
    fprintf(f, "</h1><p id=\"summary\">jlm container version %u, %s, %llu bytes, %u tensors "
               "<button id=\"reload\" type=\"button\">reload</button></p></header>\n",
            m->hdr.version, arch ? arch : "?", (unsigned long long)m->file_size, m->hdr.n_tensors);
    put_bars(f, m, r);
    fputs("<div class=\"cols\">", f);
    put_region_table(f, r);
    fputs("<section id=\"region-detail\"></section></div>\n<main><section id=\"region-contents\"></section>"
          "<section id=\"grid\"></section>"
          "<section id=\"page-detail\"></section></main>\n<script type=\"application/json\" id=\"jlm-data\">", f);
    fputs(data, f);
    fprintf(f, "</script>\n<script>\n%s</script>\n</body></html>\n", PICTURE_PAGE_JS);
}

int jlm_pic_html(const jlm_model *m, const jlm_pic_overlay *ov, const char *title, char **out, size_t *len,
                 jlm_err *err)
{
    char *data = NULL;
    int e = jlm_pic_data_json(m, ov, &data, err);
    if (e)
        return e;
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (f) {
        put_page(f, m, title ? title : m->path, data);
        if (fclose(f))
            buf = NULL;
    }
    free(data);
    if (!buf)
        return jlm_errf(err, JLM_ENOMEM, "%s: picture: out of memory", m->path);
    *out = buf;
    *len = n;
    return 0;
}

/* ---------------------------------------------------------------- file output */
int jlm_pic_write(const char *path, const char *html, size_t len, jlm_err *err)
{
    char *part = NULL;
    if (asprintf(&part, "%s.part", path) < 0)
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", path);
    FILE *f = fopen(part, "wb");
    int e = f ? 0 : errno;
    if (f && fwrite(html, 1, len, f) != len)
        e = errno ? errno : EIO;
    if (f && fclose(f) && !e)
        e = errno;
    if (!e && rename(part, path))
        e = errno;
    if (!e) {
        free(part);
        return 0;
    }
    unlink(part);
    free(part);
    return jlm_errf(err, e == ENOSPC ? JLM_ENOSPC : JLM_EIO, "%s: cannot write: %s", path, strerror(e));
}

/* test_picture.c - `jlm info --html` (picture/): the page's data against the
 * header bytes, `jlm info --json` and the engine's pager; escaping of hostile
 * container strings; and the page as headless Chromium renders it (skipped,
 * saying so in one line, where chromium is not installed). */
#include <criterion/criterion.h>
#include <jansson.h>

#include "converter/convert.h"
#include "engine/model.h"
#include "engine/pager.h"
#include "residency/residency.h"
#include "engine/source.h"
#include "picture/picture.h"
#include "tests/shell_jlm.h"
#include "tests/testutil.h"

/* ---------------------------------------------------------------- fixtures */
static char *convert(const char *gguf, const char *dir, const char *name)
{
    jlm_err err = {0};
    char *out = tu_convert(gguf, dir, name, &err);
    cr_assert_not_null(out, "%s", err.msg);
    return out;
}

static jlm_model *open_model(const char *path)
{
    jlm_model *m = NULL;
    jlm_err err = {0};
    cr_assert_eq(jlm_fmt_open(path, &m, &err), 0, "%s", err.msg);
    return m;
}

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint32_t le32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static json_t *run_json(const char *cmd)
{
    char *out = NULL;
    cr_assert_eq(tu_run(cmd, &out), 0, "%s: %s", cmd, out);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert_not_null(j, "%s: not JSON: %s", cmd, je.text);
    free(out);
    return j;
}

#define JI(o, k) ((uint64_t)json_integer_value(json_object_get((o), (k))))

/* ---------------------------------------------------------------- regions */
/* Each region against the header's bytes at the offsets of jlm-format.md 3
 * (read here, not by the reader) and against `jlm info --json`; in file order,
 * not overlapping, the last one ending at EOF. */
static void check_regions_of(const char *path, const char *gguf)
{
    char cmd[2048];
    jlm_model *m = open_model(path);
    jlm_pic_region r[JLM_PIC_N_REGIONS];
    jlm_pic_regions(m, r);
    size_t n;
    unsigned char *b = tu_read_file(path, &n);
    cr_assert(b && n >= 192);
    uint64_t want[JLM_PIC_N_REGIONS][2] = {
        {0, 192}, {le64(b + 32), le64(b + 40)}, {le64(b + 120), le64(b + 128)}, {le64(b + 104), le64(b + 112)},
        {le64(b + 48), le64(b + 56)}, {le64(b + 88), le64(b + 96)}, {le64(b + 72), le64(b + 80)},
        {le64(b + 64), le32(b + 24) * le64(b + 16)}, {le64(b + 136), le32(b + 152) * le64(b + 144)},
        {le64(b + 176), le32(b + 172) * le64(b + 184)},
    };
    snprintf(cmd, sizeof cmd, "'%s' info '%s' --json", tu_jlm(), path);
    json_t *j = run_json(cmd), *h = json_object_get(j, "header");
    uint64_t info[4][2] = {{JI(h, "dense_off"), JI(h, "dense_len")}, {JI(h, "data_off"), JI(h, "n_blocks") * JI(h, "page_size")},
        {JI(h, "vis_data_off"), JI(h, "n_vis_blocks") * JI(h, "vis_page_size")},
        {JI(h, "exp_data_off"), JI(h, "n_exp_pages") * JI(h, "exp_page_size")}};
    uint64_t end = 0;
    for (int i = 0; i < JLM_PIC_N_REGIONS; i++) {
        cr_assert_eq(r[i].off, want[i][0], "%s: %s offset %llu, header bytes say %llu", gguf, r[i].id,
                     (unsigned long long)r[i].off, (unsigned long long)want[i][0]);
        cr_assert_eq(r[i].len, want[i][1], "%s: %s length", gguf, r[i].id);
        if (i >= JLM_PIC_DENSE && r[i].len) {
            cr_assert_eq(r[i].off, info[i - JLM_PIC_DENSE][0], "%s: %s offset vs jlm info --json", gguf, r[i].id);
            cr_assert_eq(r[i].len, info[i - JLM_PIC_DENSE][1], "%s: %s length vs jlm info --json", gguf, r[i].id);
        }
        if (!r[i].len)
            continue;
        cr_assert_geq(r[i].off, end, "%s: %s overlaps the region before it", gguf, r[i].id);
        cr_assert_eq(r[i].off % r[i].align, 0, "%s: %s misaligned", gguf, r[i].id);
        end = r[i].off + r[i].len;
    }
    cr_assert_eq(end, JI(j, "file_size"), "%s: last region ends at %llu, file has %llu bytes", gguf,
                 (unsigned long long)end, (unsigned long long)JI(j, "file_size"));
    json_decref(j);
    free(b);
    jlm_fmt_close(m);
}

static void check_regions(const char *gguf)
{
    char *dir = tu_tmpdir(), *path = convert(gguf, dir, "m.jlm");
    check_regions_of(path, gguf);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* A shell container (tests/shell_jlm.h) with a 3-block vision tower beside 2
 * text blocks, with the vision roles of docs/vision.md. */
static char *vision_container(const char *dir)
{
    static shell_list L;
    memset(&L, 0, sizeof L);
    jlm_config c = {.arch = JLM_ARCH_GEMMA3, .n_layer = 2, .n_embd = 64, .n_head = 4, .n_kv_head = 2, .head_dim = 16,
                    .n_rot = 16, .n_ffn = 128, .n_vocab = 4, .n_ctx = 256, .rms_eps = 1e-6f, .rope_base = 10000.0f};
    jlm_vision v = {.n_layer = 3, .n_embd = 64, .n_head = 4, .n_ffn = 128, .image_size = 32, .patch_size = 2,
                    .proj_dim = 64, .scale = 1, .eps = 1e-6f, .projector = 4, .std = {1, 1, 1}};
    char nm[48];
    shell_add(&L, JLM_R_TOKEN_EMBD, -1, JLM_T_F32, 2, 64, 4, 1, "token_embd.weight");
    shell_add(&L, JLM_R_OUTPUT_NORM, -1, JLM_T_F32, 1, 64, 1, 1, "output_norm.weight");
    for (int b = 0; b < 2; b++) {
        snprintf(nm, sizeof nm, "blk.%d.attn_q.weight", b);
        shell_add(&L, JLM_R_ATTN_Q, b, JLM_T_Q8_0, 2, 64, 64, 1, nm);
        snprintf(nm, sizeof nm, "blk.%d.ffn_down.weight", b);
        shell_add(&L, JLM_R_FFN_DOWN, b, JLM_T_Q4_K, 2, 256, 64, 1, nm);
    }
    for (int b = 0; b < 3; b++) {
        snprintf(nm, sizeof nm, "v.blk.%d.attn_q.weight", b);
        shell_add(&L, JLM_R_V_ATTN_Q, b, JLM_T_F16, 2, 64, 64 * (b + 1), 1, nm);
        snprintf(nm, sizeof nm, "v.blk.%d.ffn_up.weight", b);
        shell_add(&L, JLM_R_V_FFN_UP, b, JLM_T_Q8_0, 2, 64, 128, 1, nm);
    }
    char *path = malloc(1200);
    snprintf(path, 1200, "%s/v.jlm", dir);
    jlm_err err = {0};
    cr_assert_eq(shell_write(path, &c, &v, &L, &err), 0, "%s", err.msg);
    return path;
}

Test(picture, regions_match_header_bytes_and_info_json_vision)
{
    char *dir = tu_tmpdir(), *path = vision_container(dir);
    jlm_model *m = open_model(path);
    cr_assert_eq(m->hdr.n_vis_blocks, 3);
    cr_assert(m->has_vision);
    jlm_fmt_close(m);
    check_regions_of(path, "vision shell");
    free(path);
    tu_rmrf(dir);
    free(dir);
}

Test(picture, regions_match_header_bytes_and_info_json_dense) { check_regions("stories260K.gguf"); }
Test(picture, regions_match_header_bytes_and_info_json_moe) { check_regions("synth-qwen3moe-256.Q4_K_M.gguf"); }
Test(picture, regions_match_header_bytes_and_info_json_gpt_oss) { check_regions("synth-gpt-oss-256.MXFP4_MOE.gguf"); }

/* ---------------------------------------------------------------- page arrays */
/* Every page's span in the data is the one the engine's pager reads:
 * base + i*size, length jlm_pager_extent of a pager opened on the container. */
static void check_spans_of(const char *path, const char *gguf)
{
    jlm_model *m = open_model(path);
    jlm_err err = {0};
    jlm_source *s = NULL;
    jlm_pager *p = NULL;
    cr_assert_eq(jlm_source_open_file(path, NULL, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_pager_open_model(m, s, 0, &p, &err), 0, "%s", err.msg);
    char *js = NULL;
    cr_assert_eq(jlm_pic_data_json(m, NULL, &js, &err), 0, "%s", err.msg);
    json_t *d = json_loads(js, 0, NULL), *arrays = json_object_get(d, "arrays");
    cr_assert_not_null(arrays);
    const char *names[3] = {"text", "vision", "experts"};
    uint64_t base[3] = {m->hdr.data_off, m->hdr.vis_data_off, m->hdr.exp_data_off};
    uint64_t size[3] = {m->hdr.page_size, m->hdr.vis_page_size, m->hdr.exp_page_size};
    uint32_t np[3] = {m->hdr.n_blocks, m->hdr.n_vis_blocks, m->hdr.n_exp_pages}, checked = 0;
    for (int a = 0; a < 3; a++) {
        json_t *A = json_object_get(arrays, names[a]), *ext = json_object_get(A, "extents");
        cr_assert_eq(JI(A, "n"), np[a]);
        cr_assert_eq(json_array_size(ext), np[a]);
        if (!np[a])
            continue;
        cr_assert_eq(JI(A, "base"), base[a]);
        cr_assert_eq(JI(A, "page_size"), size[a]);
        for (uint32_t i = 0; i < np[a]; i++, checked++) {
            uint64_t e = (uint64_t)json_integer_value(json_array_get(ext, i));
            cr_assert_eq(e, jlm_pager_extent(p, (uint32_t)a, i), "%s: %s page %u: extent %llu, pager reads %llu", gguf,
                         names[a], i, (unsigned long long)e, (unsigned long long)jlm_pager_extent(p, (uint32_t)a, i));
            cr_assert(e > 0 && e <= size[a]);
        }
    }
    cr_assert_gt(checked, 0);
    cr_assert_eq(json_array_size(json_object_get(d, "tensors")), m->hdr.n_tensors);
    json_decref(d);
    free(js);
    jlm_pager_close(p);
    jlm_source_close(s);
    jlm_fmt_close(m);
}

static void check_spans(const char *gguf)
{
    char *dir = tu_tmpdir(), *path = convert(gguf, dir, "m.jlm");
    check_spans_of(path, gguf);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

Test(picture, page_spans_are_the_pagers_dense) { check_spans("stories260K.gguf"); }
Test(picture, page_spans_are_the_pagers_moe) { check_spans("synth-llama-moe-256.Q4_K_M.gguf"); }
Test(picture, page_spans_are_the_pagers_vision)
{
    char *dir = tu_tmpdir(), *path = vision_container(dir);
    check_spans_of(path, "vision shell");
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- escaping */
static const char *HOSTILE_T = "</script><script>alert(1)</script><img src=x onerror=alert(2)>";
static const char *HOSTILE_N = "<!--<script>&amp;\xff\xfe-->";

/* A model whose tensor names and chat template names are hostile (set in
 * memory after a valid open: the generator must not trust them). */
static jlm_model *hostile_model(const char *path, jlm_str tmpl[2])
{
    jlm_model *m = open_model(path);
    m->tensors[0].name = (jlm_str){HOSTILE_T, (uint32_t)strlen(HOSTILE_T)};
    m->tensors[1].name = (jlm_str){HOSTILE_N, (uint32_t)strlen(HOSTILE_N)};
    tmpl[0] = (jlm_str){HOSTILE_T, (uint32_t)strlen(HOSTILE_T)};
    tmpl[1] = (jlm_str){"", 0};
    m->vocab.templates = tmpl;
    m->vocab.n_templates = 1;
    return m;
}

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

Test(picture, hostile_names_stay_inside_the_json_and_round_trip)
{
    char *dir = tu_tmpdir(), *path = convert("stories260K.gguf", dir, "m.jlm");
    jlm_str tmpl[2];
    jlm_model *m = hostile_model(path, tmpl);
    jlm_err err = {0};
    char *html = NULL;
    size_t len = 0;
    cr_assert_eq(jlm_pic_html(m, NULL, "<b>title</b>", &html, &len, &err), 0, "%s", err.msg);
    cr_assert_eq(strlen(html), len);
    cr_assert_eq(count(html, "<script"), 2, "only the data block and the page's script open a script");
    cr_assert_eq(count(html, "</script"), 2);
    cr_assert_eq(count(html, "<img"), 0);
    cr_assert_eq(count(html, "<!--"), 0);
    cr_assert_eq(count(html, "<b>"), 0, "the title is escaped");
    /* the data block parses back to the same names (invalid bytes as U+FFFD) */
    const char *a = strstr(html, "id=\"jlm-data\">") + 14, *b = strstr(a, "</script>");
    json_error_t je;
    json_t *d = json_loadb(a, (size_t)(b - a), 0, &je);
    cr_assert_not_null(d, "data block: %s", je.text);
    json_t *t = json_object_get(d, "tensors");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(t, 0), "name")), HOSTILE_T);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(t, 1), "name")),
                     "<!--<script>&amp;\xEF\xBF\xBD\xEF\xBF\xBD-->");
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(json_object_get(d, "vocab"), "templates"), 0)),
                     HOSTILE_T);
    json_decref(d);
    free(html);
    jlm_fmt_close(m);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

Test(picture, write_is_atomic_and_names_the_file_on_failure)
{
    char *dir = tu_tmpdir(), path[1200], part[1300];
    jlm_err err = {0};
    snprintf(path, sizeof path, "%s/no/such/dir/p.html", dir);
    cr_assert_neq(jlm_pic_write(path, "x", 1, &err), 0);
    cr_assert(strstr(err.msg, path), "message names the file: %s", err.msg);
    snprintf(path, sizeof path, "%s/p.html", dir);
    snprintf(part, sizeof part, "%s.part", path);
    cr_assert_eq(jlm_pic_write(path, "<html></html>", 13, &err), 0, "%s", err.msg);
    cr_assert(tu_exists(path) && !tu_exists(part));
    tu_rmrf(dir);
    free(dir);
}

Test(picture, cli_refuses_bad_input_with_one_line)
{
    char *dir = tu_tmpdir(), cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "cd '%s' && printf 'JITLLM\\0\\0garbage' > bad.jlm && '%s' info bad.jlm --html -o p.html 2>&1; "
             "test ! -e p.html && test ! -e p.html.part", dir, tu_jlm());
    cr_assert_eq(tu_run(cmd, &out), 0, "no page is left behind: %s", out);
    cr_assert(strstr(out, "bad.jlm") && count(out, "\n") == 1, "one line naming the file: %s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' info x.jlm --json --html", tu_jlm());
    cr_assert_eq(tu_run(cmd, NULL), 2);
    tu_rmrf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- the page in Chromium */
/* Chromium's DOM of file#hash after the page's scripts ran (malloc'd). Skips,
 * in one line, where chromium is not installed (scripts/deps.sh installs it). */
static char *chromium_dom(const char *file, const char *hash, const char *dir)
{
    if (system("command -v chromium >/dev/null 2>&1") != 0)
        cr_skip_test("chromium is not installed: the page is not rendered (scripts/deps.sh installs it)");
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "{ timeout 60 chromium --headless --no-sandbox --disable-gpu --user-data-dir='%s/chromium' "
             "--no-first-run --disable-extensions --disable-background-networking --disable-component-update "
             "--disable-sync --mute-audio --dump-dom 'file://%s#%s' 2>/dev/null; }", dir, file, hash);
    cr_assert_eq(tu_run(cmd, &out), 0, "chromium failed on %s#%s", file, hash);
    cr_assert(strstr(out, "</html>"), "no DOM for %s#%s: %.300s", file, hash, out);
    return out;
}

/* The first text inside the element with this id (past any opening tags). */
static char *dom_text(const char *dom, const char *id)
{
    char key[128];
    snprintf(key, sizeof key, "id=\"%s\"", id);
    const char *p = strstr(dom, key);
    cr_assert_not_null(p, "no element #%s in the DOM", id);
    p = strchr(p, '>') + 1;
    while (*p == '<')
        p = strchr(p, '>') + 1;
    size_t n = strcspn(p, "<");
    return strndup(p, n);
}

static void assert_dom_u64(const char *dom, const char *id, uint64_t want)
{
    char *t = dom_text(dom, id);
    cr_assert_eq(strtoull(t, NULL, 10), want, "#%s shows '%s', want %llu", id, t, (unsigned long long)want);
    free(t);
}

/* The tensor names in #page-tensors' rows, "\n"-joined. */
static char *dom_page_tensors(const char *dom)
{
    const char *p = strstr(dom, "id=\"page-tensors\""), *end = p ? strstr(p, "</table>") : NULL;
    cr_assert(p && end, "no #page-tensors table");
    p = strstr(p, "<tbody>");
    char *out = calloc(1, (size_t)(end - p) + 1);
    while ((p = strstr(p, "<tr><td")) && p < end) {
        p = strchr(p + 4, '>') + 1;
        strncat(out, p, strcspn(p, "<"));
        strcat(out, "\n");
    }
    return out;
}

/* The names the tensor table puts on page `page` of region reg. */
static char *expected_tensors(const jlm_model *m, int reg, uint32_t page)
{
    char *out = calloc(1, 65536);
    for (uint32_t i = 0; i < m->hdr.n_tensors; i++) {
        jlm_tensor_loc l;
        jlm_fmt_tensor_loc(m, &m->tensors[i], &l);
        int64_t n = reg == JLM_REG_EXPERT && m->tensors[i].index < 0 ? m->config.n_expert : 1;
        if (l.region == reg && (int64_t)page >= l.page && (int64_t)page < l.page + n) {
            strcat(out, m->tensors[i].name.s);
            strcat(out, "\n");
        }
    }
    return out;
}

static char *write_page(const jlm_model *m, const jlm_pic_overlay *ov, const char *dir, const char *name)
{
    char *html = NULL, *path = malloc(1200);
    size_t len = 0;
    jlm_err err = {0};
    cr_assert_eq(jlm_pic_html(m, ov, NULL, &html, &len, &err), 0, "%s", err.msg);
    cr_assert_lt(len, 200 * 1024, "the page of a test model stays under 200 KiB (%zu bytes)", len);
    snprintf(path, 1200, "%s/%s", dir, name);
    cr_assert_eq(jlm_pic_write(path, html, len, &err), 0, "%s", err.msg);
    free(html);
    return path;
}

/* #region=text&page=N: the page's span, padding and tensors as the DOM shows
 * them after the scripts ran; every region's row with its offset and length. */
static void check_page_in_chromium(const char *dir, const char *path, int reg, uint32_t page)
{
    char hash[64];
    jlm_model *m = open_model(path);
    char *html = write_page(m, NULL, dir, "m.html");
    int vis = reg == JLM_REG_VISION;
    snprintf(hash, sizeof hash, "region=%s&page=%u", vis ? "vision" : "text", page);
    char *dom = chromium_dom(html, hash, dir);
    uint64_t base = vis ? m->hdr.vis_data_off : m->hdr.data_off, size = vis ? m->hdr.vis_page_size : m->hdr.page_size;
    uint64_t off = base + page * size, ext = jlm_fmt_page_extent(m, reg, page);
    assert_dom_u64(dom, "page-index", page);
    assert_dom_u64(dom, "page-off", off);
    assert_dom_u64(dom, "page-len", ext);
    assert_dom_u64(dom, "page-pad", size - ext);
    char span[96], *t = dom_text(dom, "page-span");
    snprintf(span, sizeof span, "[%llu, %llu)", (unsigned long long)off, (unsigned long long)(off + ext));
    cr_assert_str_eq(t, span);
    free(t);
    char *got = dom_page_tensors(dom), *want = expected_tensors(m, reg, page);
    cr_assert(*want, "page %u holds tensors", page);
    cr_assert_str_eq(got, want, "tensors of page %u", page);
    assert_dom_u64(dom, "sel-off", base);
    jlm_pic_region r[JLM_PIC_N_REGIONS];
    jlm_pic_regions(m, r);
    for (int i = 0; i < JLM_PIC_N_REGIONS; i++) {
        char row[64];
        snprintf(row, sizeof row, "id=\"row-%s\"", r[i].id);
        const char *p = strstr(dom, row);
        cr_assert_not_null(p, "no row for %s", r[i].id);
        unsigned long long o, l;
        cr_assert_eq(sscanf(strstr(p, "class=\"off\">"), "class=\"off\">%llu</td><td class=\"len\">%llu", &o, &l), 2);
        cr_assert(o == r[i].off && l == r[i].len, "%s row shows %llu+%llu", r[i].id, o, l);
    }
    free(got); free(want); free(dom); free(html);
    jlm_fmt_close(m);
}

static void check_text_page_in_chromium(const char *gguf, uint32_t page)
{
    char *dir = tu_tmpdir(), *path = convert(gguf, dir, "m.jlm");
    check_page_in_chromium(dir, path, JLM_REG_TEXT, page);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

Test(picture_chromium, text_page_span_and_tensors_dense, .timeout = 120) { check_text_page_in_chromium("stories260K.gguf", 3); }
Test(picture_chromium, text_page_span_and_tensors_moe, .timeout = 120) { check_text_page_in_chromium("synth-qwen3moe-256.Q4_K_M.gguf", 1); }
Test(picture_chromium, vision_page_span_and_tensors, .timeout = 120)
{
    char *dir = tu_tmpdir(), *path = vision_container(dir);
    check_page_in_chromium(dir, path, JLM_REG_VISION, 2);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

static size_t count_cells(const char *dom, const char *cls, const char *names_of, char *names, size_t cap)
{
    size_t n = 0;
    for (const char *p = dom; (p = strstr(p, "<rect ")); p++) {
        const char *e = strchr(p, '>');
        char *tag = strndup(p, (size_t)(e - p));
        if (strstr(tag, "class=\"cell") && (!cls || strstr(tag, cls))) {
            n++;
            const char *d = strstr(tag, names_of);
            if (names && d) {
                d += strlen(names_of);
                strncat(names, d, strcspn(d, "\""));
                strncat(names, "\n", cap - strlen(names) - 1);
            }
        }
        free(tag);
    }
    return n;
}

/* #region=experts&page=N: the grid has NBlocks x NExpert cells, page N is
 * (rank 1, expert 3) with the banks' sheets at + 3 x ExpPageSize. */
Test(picture_chromium, experts_grid_and_page, .timeout = 120)
{
    char *dir = tu_tmpdir(), *path = convert("synth-qwen3moe-256.Q4_K_M.gguf", dir, "m.jlm"), hash[64];
    jlm_model *m = open_model(path);
    char *html = write_page(m, NULL, dir, "m.html");
    uint32_t ne = m->config.n_expert, page = ne + 3;
    cr_assert_geq(m->hdr.n_exp_pages, 2 * ne);
    snprintf(hash, sizeof hash, "region=experts&page=%u", page);
    char *dom = chromium_dom(html, hash, dir);
    cr_assert_eq(count_cells(dom, NULL, "", NULL, 0), m->hdr.n_exp_pages);
    assert_dom_u64(dom, "page-index", page);
    assert_dom_u64(dom, "page-off", m->hdr.exp_data_off + page * m->hdr.exp_page_size);
    assert_dom_u64(dom, "page-len", jlm_fmt_page_extent(m, JLM_REG_EXPERT, page));
    char *got = dom_page_tensors(dom), *want = expected_tensors(m, JLM_REG_EXPERT, page);
    cr_assert(*want);
    cr_assert_str_eq(got, want);
    const jlm_tensor *bank = NULL;
    for (uint32_t i = 0; i < m->hdr.n_tensors && !bank; i++)
        if (!strcmp(m->tensors[i].name.s, strtok(want, "\n")))
            bank = &m->tensors[i];
    char name[64], *t = dom_text(dom, "page-name");
    snprintf(name, sizeof name, "experts.%d.3", bank->block);
    cr_assert_str_eq(t, name);
    char qs[64];
    snprintf(qs, sizeof qs, "<td class=\"num\">%llu</td>", (unsigned long long)(bank->qs_off + 3 * m->hdr.exp_page_size));
    cr_assert(strstr(strstr(dom, "id=\"page-tensors\""), qs), "expert 3's qs plane at %s", qs);
    free(t); free(got); free(want); free(dom); free(html);
    jlm_fmt_close(m);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* The overlay marks exactly the pages the database lists as resident, and
 * pages paged in then evicted as touched. */
Test(picture_chromium, overlay_marks_exactly_the_resident_pages, .timeout = 120)
{
    char *dir = tu_tmpdir(), *path = convert("synth-qwen3moe-256.Q4_K_M.gguf", dir, "m.jlm"), db_path[1200];
    jlm_model *m = open_model(path);
    snprintf(db_path, sizeof db_path, "%s/res.db", dir);
    jlm_err err = {0};
    jlm_rdb *db = NULL;
    int64_t s;
    cr_assert_eq(jlm_rdb_open(db_path, 1, &db, &err), 0, "%s", err.msg);
    cr_assert_eq(jlm_rdb_session_begin(db, "m.jlm", &s, &err), 0, "%s", err.msg);
    int ev[][5] = {{0, 1, -1, JLM_RDB_PAGE_IN}, {0, 0, -1, JLM_RDB_PAGE_IN}, {0, 0, -1, JLM_RDB_EVICT},
                   {1, 1, 2, JLM_RDB_PAGE_IN}, {1, 0, 5, JLM_RDB_PAGE_IN}, {1, 0, 5, JLM_RDB_EVICT}};
    for (size_t i = 0; i < sizeof ev / sizeof ev[0]; i++)
        cr_assert_eq(jlm_rdb_event(db, s, ev[i][0] ? "experts" : "blocks", ev[i][1], ev[i][2], ev[i][3], 1, 4096, &err),
                     0, "%s", err.msg);
    cr_assert_eq(jlm_rdb_flush(db, &err), 0, "%s", err.msg);
    char **names = NULL;
    size_t n = 0;
    cr_assert_eq(jlm_rdb_resident(db, "m.jlm", &names, &n, &err), 0, "%s", err.msg);
    jlm_pic_overlay ov = {db_path, "m.jlm", NULL};
    char *html = write_page(m, &ov, dir, "m.html");
    const char *arrays[2] = {"text", "experts"}, *prefix[2] = {"blocks.", "experts."};
    const char *touched[2] = {"blocks.0\n", "experts.0.5\n"};
    for (int a = 0; a < 2; a++) {
        char hash[64], want[256] = "", got[256] = "", gt[256] = "";
        for (size_t i = 0; i < n; i++)
            if (!strncmp(names[i], prefix[a], strlen(prefix[a])))
                strcat(strcat(want, names[i]), "\n");
        snprintf(hash, sizeof hash, "region=%s", arrays[a]);
        char *dom = chromium_dom(html, hash, dir);
        count_cells(dom, "res-now", "data-name=\"", got, sizeof got);
        count_cells(dom, "res-touched", "data-name=\"", gt, sizeof gt);
        cr_assert(*want, "the database lists resident %s pages", arrays[a]);
        cr_assert_str_eq(got, want, "%s: resident cells", arrays[a]);
        cr_assert_str_eq(gt, touched[a], "%s: paged-in-before cells", arrays[a]);
        free(dom);
    }
    jlm_rdb_free_names(names, n);
    jlm_rdb_session_end(db, s, &err);
    jlm_rdb_close(db);
    free(html);
    jlm_fmt_close(m);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* Hostile tensor and template names are shown as text: no element from them. */
Test(picture_chromium, hostile_names_render_as_text, .timeout = 120)
{
    char *dir = tu_tmpdir(), *path = convert("stories260K.gguf", dir, "m.jlm");
    jlm_str tmpl[2];
    jlm_model *m = hostile_model(path, tmpl);
    char *html = write_page(m, NULL, dir, "m.html");
    char *dom = chromium_dom(html, "region=table", dir), *dom2 = chromium_dom(html, "region=vocab", dir);
    cr_assert_eq(count(dom, "<img"), 0);
    cr_assert_eq(count(dom, "<script"), 2);
    cr_assert(strstr(dom, "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;"),
              "the hostile tensor name is shown as text");
    cr_assert(strstr(dom, "id=\"tensor-table\""), "the script ran to the end");
    cr_assert(strstr(strstr(dom2, "id=\"templates\""), "<li>&lt;/script&gt;&lt;script&gt;alert(1)"),
              "the hostile template name is shown as text");
    cr_assert_eq(count(dom2, "<img"), 0);
    free(dom); free(dom2); free(html);
    jlm_fmt_close(m);
    free(path);
    tu_rmrf(dir);
    free(dir);
}

/* picture.h - the container as a picture: one self-contained HTML page (inline
 * SVG, CSS and plain JavaScript, no network) drawn from a container's header
 * and tensor table, optionally coloured by the residency database.
 *
 * Owns: the page's data (regions in file order, page arrays with the spans the
 * engine reads, tensors with their planes) and its HTML. Knows nothing of how
 * the page is served (cli/ writes it to a file; docs/picture.md).
 *
 * Invariants:
 *  (1) Region offsets and lengths come from the header alone; page spans are
 *      `base + i*size` with the length jlm_fmt_page_extent() gives (the
 *      function the engine's pager uses), never recomputed here.
 *  (2) Every string that came from a container or a database reaches the page
 *      only inside the JSON data block, with '<', '>' and '&' written as \u
 *      escapes and invalid UTF-8 replaced by U+FFFD; the script shows it with
 *      textContent. Nothing from a container is ever parsed as HTML.
 * Memory: outputs are malloc'd and owned by the caller.
 */
#ifndef JLM_PICTURE_H
#define JLM_PICTURE_H

#include <stddef.h>
#include <stdint.h>

#include "residency/residency.h"
#include "format/jlm_format.h"

/* The ten regions of jlm-format.md section 2, in file order. */
enum jlm_pic_region_id {
    JLM_PIC_HEADER, JLM_PIC_CONFIG, JLM_PIC_VISION_RECORD, JLM_PIC_VOCAB, JLM_PIC_TABLE,
    JLM_PIC_FINGERPRINT, JLM_PIC_DENSE, JLM_PIC_TEXT, JLM_PIC_VISION, JLM_PIC_EXPERTS,
    JLM_PIC_N_REGIONS
};

typedef struct jlm_pic_region {
    const char *id;       /* "header", "config", "vision-record", ... (the URL hash's names) */
    const char *label;    /* "vision record" */
    uint64_t    off, len; /* bytes; len 0: absent */
    uint64_t    align;    /* alignment the format requires: 1 (packed) or 4096 */
} jlm_pic_region;

/* The regions of m in file order (all JLM_PIC_N_REGIONS, absent ones with len 0). */
void jlm_pic_regions(const jlm_model *m, jlm_pic_region out[JLM_PIC_N_REGIONS]);

/* A residency overlay: the view's database and the model's key in it. db, when
 * set, is an open connection to use (borrowed; the jlmfs daemon passes its own
 * under its lock), else db_path is opened for the call. */
typedef struct jlm_pic_overlay {
    const char *db_path;
    const char *model_key;
    jlm_rdb    *db;
} jlm_pic_overlay;

/* The page's data as JSON text (what the script reads), malloc'd. ov NULL: no
 * overlay. JLM_ENOMEM; a database error (JLM_EIO...) names the database. */
int jlm_pic_data_json(const jlm_model *m, const jlm_pic_overlay *ov, char **out, jlm_err *err);

/* The whole page, malloc'd, NUL-terminated; *len its length. title is shown
 * escaped (NULL: the container's path). */
int jlm_pic_html(const jlm_model *m, const jlm_pic_overlay *ov, const char *title, char **out, size_t *len,
                 jlm_err *err);

/* Writes the page to path atomically (path.part, then rename): on failure
 * nothing is left behind. */
int jlm_pic_write(const char *path, const char *html, size_t len, jlm_err *err);

#endif

/* constrain.c - request fields -> grammar (constrain.h). */
#include "serve/constrain.h"

#include <stdlib.h>
#include <string.h>

/* A schema object (NULL: any JSON object) -> *out. */
static int from_schema(json_t *schema, const char *field, jlm_gram **out, jlm_err *err)
{
    char *text = NULL, *gbnf = NULL;
    if (schema && !(text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY)))
        return jlm_errf(err, JLM_ENOMEM, "%s: out of memory", field);
    int rc = jlm_gram_from_schema(text, text ? strlen(text) : 0, &gbnf, err);
    if (!rc)
        rc = jlm_gram_parse(gbnf, strlen(gbnf), out, err);
    free(text);
    free(gbnf);
    if (rc && strcmp(field, "json_schema"))   /* the converter's messages start with "json_schema:" */
        return jlm_err_prefix(err, rc, "%s", field);
    return rc;
}

int jlm_srv_constraint(json_t *body, jlm_gram **out, jlm_err *err)
{
    json_t *gr = json_object_get(body, "grammar"), *js = json_object_get(body, "json_schema");
    json_t *rf = json_object_get(body, "response_format");
    if (gr && json_is_null(gr)) gr = NULL;
    if (js && json_is_null(js)) js = NULL;
    if (rf && json_is_null(rf)) rf = NULL;
    if (rf) {
        if (!json_is_object(rf) || !json_is_string(json_object_get(rf, "type")))
            return jlm_errf(err, JLM_EINVAL, "response_format: expected an object with a string \"type\"");
        if (!strcmp(json_string_value(json_object_get(rf, "type")), "text"))
            rf = NULL;
    }
    if (!!gr + !!js + !!rf > 1)
        return jlm_errf(err, JLM_EINVAL, "grammar, json_schema and response_format exclude each other");
    if (gr) {
        if (!json_is_string(gr))
            return jlm_errf(err, JLM_EINVAL, "grammar: expected a string (GBNF)");
        return jlm_gram_parse(json_string_value(gr), json_string_length(gr), out, err);   /* "grammar: line L, ..." */
    }
    if (js) {
        if (!json_is_object(js))
            return jlm_errf(err, JLM_EINVAL, "json_schema: expected an object");
        return from_schema(js, "json_schema", out, err);
    }
    if (!rf) {
        *out = NULL;
        return 0;
    }
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!strcmp(type, "json_object")) {
        json_t *sc = json_object_get(rf, "schema");
        if (sc && !json_is_object(sc))
            return jlm_errf(err, JLM_EINVAL, "response_format.schema: expected an object");
        return from_schema(sc, "response_format", out, err);
    }
    if (!strcmp(type, "json_schema")) {
        json_t *w = json_object_get(rf, "json_schema");
        if (!json_is_object(w))
            return jlm_errf(err, JLM_EINVAL, "response_format.json_schema: expected an object");
        json_t *sc = json_object_get(w, "schema");
        if (sc && !json_is_object(sc) && !json_is_boolean(sc))
            return jlm_errf(err, JLM_EINVAL, "response_format.json_schema.schema: expected an object");
        json_t *any = NULL;
        if (!sc || json_is_true(sc))
            sc = any = json_object();   /* no schema: any JSON value */
        int rc = !sc ? jlm_errf(err, JLM_ENOMEM, "response_format: out of memory")
                     : from_schema(sc, "response_format.json_schema.schema", out, err);
        json_decref(any);
        return rc;
    }
    return jlm_errf(err, JLM_EINVAL, "response_format.type: '%s' is not one of text, json_object, json_schema", type);
}

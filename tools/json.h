/*
 * json.h - a minimal streaming JSON writer for the --json outputs.
 *
 * The writer tracks commas, so callers only say what comes next:
 *
 *     json_begin_object(&w);
 *     json_key(&w, "id");
 *     json_u64(&w, 1);
 *     json_end_object(&w);
 */
#ifndef PLX_TOOLS_JSON_H
#define PLX_TOOLS_JSON_H

#include <stdint.h>
#include <stdio.h>

#define JSON_MAX_DEPTH 8

struct json_writer {
    FILE *out;
    int depth;
    int after_key;                 /* the next value completes a "key": pair */
    int has_items[JSON_MAX_DEPTH]; /* per open container: a comma is due */
};

void json_init(struct json_writer *w, FILE *out);
void json_begin_object(struct json_writer *w);
void json_end_object(struct json_writer *w);
void json_begin_array(struct json_writer *w);
void json_end_array(struct json_writer *w);
void json_key(struct json_writer *w, const char *key);
void json_string(struct json_writer *w, const char *s);
void json_u64(struct json_writer *w, uint64_t v);
void json_double(struct json_writer *w, double v);
void json_null(struct json_writer *w);
void json_bool(struct json_writer *w, int v);
/* End the document with a newline. */
void json_finish(struct json_writer *w);

/* Write s as a quoted JSON string. Invalid UTF-8 becomes U+FFFD so the output always parses. */
void json_write_string(FILE *out, const char *s);

#endif

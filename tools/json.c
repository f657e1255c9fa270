#include "json.h"

#include <assert.h>

#include "utf8.h"

void json_init(struct json_writer *w, FILE *out)
{
    w->out = out;
    w->depth = 0;
    w->after_key = 0;
}

static void before_item(struct json_writer *w)
{
    if (w->after_key) {
        w->after_key = 0;
        return;
    }
    if (w->depth == 0)
        return;
    if (w->has_items[w->depth - 1])
        fputc(',', w->out);
    w->has_items[w->depth - 1] = 1;
}

static void open_container(struct json_writer *w, char c)
{
    before_item(w);
    assert(w->depth < JSON_MAX_DEPTH);
    fputc(c, w->out);
    w->has_items[w->depth++] = 0;
}

static void close_container(struct json_writer *w, char c)
{
    assert(w->depth > 0 && !w->after_key);
    w->depth--;
    fputc(c, w->out);
}

void json_begin_object(struct json_writer *w)
{
    open_container(w, '{');
}

void json_end_object(struct json_writer *w)
{
    close_container(w, '}');
}

void json_begin_array(struct json_writer *w)
{
    open_container(w, '[');
}

void json_end_array(struct json_writer *w)
{
    close_container(w, ']');
}

void json_key(struct json_writer *w, const char *key)
{
    before_item(w);
    json_write_string(w->out, key);
    fputc(':', w->out);
    w->after_key = 1;
}

void json_string(struct json_writer *w, const char *s)
{
    before_item(w);
    json_write_string(w->out, s);
}

void json_u64(struct json_writer *w, uint64_t v)
{
    before_item(w);
    fprintf(w->out, "%llu", (unsigned long long)v);
}

void json_double(struct json_writer *w, double v)
{
    before_item(w);
    fprintf(w->out, "%.6f", v);
}

void json_null(struct json_writer *w)
{
    before_item(w);
    fputs("null", w->out);
}

void json_bool(struct json_writer *w, int v)
{
    before_item(w);
    fputs(v ? "true" : "false", w->out);
}

void json_finish(struct json_writer *w)
{
    assert(w->depth == 0);
    fputc('\n', w->out);
}

static void write_escaped_byte(FILE *out, unsigned char c)
{
    switch (c) {
    case '"':
        fputs("\\\"", out);
        break;
    case '\\':
        fputs("\\\\", out);
        break;
    case '\n':
        fputs("\\n", out);
        break;
    case '\t':
        fputs("\\t", out);
        break;
    case '\r':
        fputs("\\r", out);
        break;
    default:
        if (c < 0x20 || c == 0x7f)
            fprintf(out, "\\u%04x", c);
        else
            fputc(c, out);
    }
}

void json_write_string(FILE *out, const char *s)
{
    fputc('"', out);
    while (*s != '\0') {
        if ((unsigned char)*s < 0x80) {
            write_escaped_byte(out, (unsigned char)*s++);
            continue;
        }
        size_t n = utf8_seq_len(s);
        if (n == 0) {
            fputs("\\ufffd", out);
            s++;
        } else {
            fwrite(s, 1, n, out);
            s += n;
        }
    }
    fputc('"', out);
}

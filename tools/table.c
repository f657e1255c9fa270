#include "table.h"
#include "utf8.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

void table_init(struct table *t, size_t cols)
{
    assert(cols >= 1 && cols <= TABLE_MAX_COLS);
    t->cols = cols;
    t->rows = 0;
    t->cap = 0;
    t->cells = NULL;
}

static int table_grow(struct table *t)
{
    size_t cap = t->cap ? t->cap * 2 : 16;
    char **cells = realloc(t->cells, cap * t->cols * sizeof *cells);

    if (cells == NULL)
        return -ENOMEM;
    t->cells = cells;
    t->cap = cap;
    return 0;
}

int table_add_row(struct table *t, const char *const *cells)
{
    if (t->rows == t->cap && table_grow(t) < 0)
        return -ENOMEM;
    char **row = t->cells + t->rows * t->cols;
    for (size_t c = 0; c < t->cols; c++) {
        row[c] = strdup(cells[c]);
        if (row[c] == NULL) {
            while (c-- > 0)
                free(row[c]);
            return -ENOMEM;
        }
    }
    t->rows++;
    return 0;
}

void table_print(const struct table *t, FILE *out)
{
    size_t width[TABLE_MAX_COLS];

    for (size_t c = 0; c < t->cols; c++) {
        width[c] = 0;
        for (size_t r = 0; r < t->rows; r++) {
            size_t len = utf8_width(t->cells[r * t->cols + c]);
            width[c] = len > width[c] ? len : width[c];
        }
    }
    for (size_t r = 0; r < t->rows; r++) {
        const char *const *row = (const char *const *)t->cells + r * t->cols;
        /* Padded by display width: printf's %-*s counts bytes, and a name in UTF-8 would
         * push the columns after it. */
        for (size_t c = 0; c + 1 < t->cols; c++)
            fprintf(out, "%s%*s  ", row[c], (int)(width[c] - utf8_width(row[c])), "");
        /* No padding after the last column: trailing blanks only get in the way of grep. */
        fprintf(out, "%s\n", row[t->cols - 1]);
    }
}

void table_free(struct table *t)
{
    for (size_t i = 0; i < t->rows * t->cols; i++)
        free(t->cells[i]);
    free(t->cells);
    t->cells = NULL;
    t->rows = t->cap = 0;
}

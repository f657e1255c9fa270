/*
 * table.h - left-aligned text tables whose columns fit their widest cell.
 */
#ifndef PLX_TOOLS_TABLE_H
#define PLX_TOOLS_TABLE_H

#include <stddef.h>
#include <stdio.h>

#define TABLE_MAX_COLS 8

struct table {
    size_t cols;
    size_t rows;
    size_t cap;   /* rows allocated */
    char **cells; /* rows * cols, row-major, each malloc'd */
};

/* cols: 1 to TABLE_MAX_COLS. */
void table_init(struct table *t, size_t cols);
/* Append a row of t->cols strings (copied). Returns 0 or -ENOMEM. */
int table_add_row(struct table *t, const char *const *cells);
void table_print(const struct table *t, FILE *out);
void table_free(struct table *t);

#endif

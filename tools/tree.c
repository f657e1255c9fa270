#include "tree.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "timefmt.h"
#include "utf8.h"

#define TEE "├─ "
#define LAST "└─ "
#define BAR "│  "
#define SPACE "   "
#define LABEL_MAX (2 * PLX_NAME_MAX + 128)

struct id_key {
    uint64_t id;
    size_t idx;
};

/* Clones sorted by their source snapshot, so the clones of one snapshot form a run. */
struct clone_key {
    uint64_t parent_id;
    uint64_t parent_snap;
    uint64_t id;
    size_t idx;
};

struct forest_index {
    const struct tree_forest *f;
    struct id_key *by_id;     /* every VDI, by id */
    struct clone_key *clones; /* live clones whose source snapshot is drawn */
    size_t clone_count;
    unsigned char *drawn; /* per VDI: already printed (guards against cyclic parent links) */
};

static int cmp_u64(uint64_t a, uint64_t b)
{
    return a < b ? -1 : a > b;
}

static int cmp_id_key(const void *a, const void *b)
{
    return cmp_u64(((const struct id_key *)a)->id, ((const struct id_key *)b)->id);
}

static int cmp_clone_key(const void *pa, const void *pb)
{
    const struct clone_key *a = pa, *b = pb;
    int c = cmp_u64(a->parent_id, b->parent_id);

    if (c == 0)
        c = cmp_u64(a->parent_snap, b->parent_snap);
    return c != 0 ? c : cmp_u64(a->id, b->id);
}

static int is_live(const struct forest_index *ix, size_t vi)
{
    return vi < ix->f->vdi_count && !ix->f->vdis[vi].deleted;
}

static size_t find_vdi(const struct forest_index *ix, uint64_t id)
{
    struct id_key key = {.id = id};
    const struct id_key *k = bsearch(&key, ix->by_id, ix->f->vdi_count, sizeof key, cmp_id_key);

    return k != NULL ? k->idx : SIZE_MAX;
}

static const struct plx_snap_info *snap_log(const struct tree_forest *f, size_t vi, size_t *count)
{
    const struct plx_snap_info *log = f->snaps != NULL ? f->snaps[vi] : NULL;

    *count = log != NULL && f->snap_counts != NULL ? f->snap_counts[vi] : 0;
    return log;
}

/* The live snapshot N of vdis[vi], or NULL. */
static const struct plx_snap_info *find_snap(const struct tree_forest *f, size_t vi, uint64_t n)
{
    size_t count;
    const struct plx_snap_info *log = snap_log(f, vi, &count);

    for (size_t k = 0; k < count; k++)
        if (log[k].index == n)
            return log[k].deleted ? NULL : &log[k];
    return NULL;
}

/* The snapshot a live clone hangs under, or NULL when it is not a clone or the snapshot is not
 * drawn (deleted, or its VDI deleted or unknown). */
static const struct plx_snap_info *source_snap(const struct forest_index *ix, size_t vi)
{
    const struct plx_vdi_info *v = &ix->f->vdis[vi];
    size_t pi;

    if (v->parent_id == 0)
        return NULL;
    pi = find_vdi(ix, v->parent_id);
    return is_live(ix, pi) ? find_snap(ix->f, pi, v->parent_snap) : NULL;
}

static void index_free(struct forest_index *ix)
{
    free(ix->by_id);
    free(ix->clones);
    free(ix->drawn);
}

static int index_build(struct forest_index *ix, const struct tree_forest *f)
{
    size_t n = f->vdi_count;

    memset(ix, 0, sizeof *ix);
    ix->f = f;
    ix->by_id = calloc(n + 1, sizeof *ix->by_id);
    ix->clones = calloc(n + 1, sizeof *ix->clones);
    ix->drawn = calloc(n + 1, 1);
    if (ix->by_id == NULL || ix->clones == NULL || ix->drawn == NULL) {
        index_free(ix);
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        ix->by_id[i] = (struct id_key){.id = f->vdis[i].id, .idx = i};
    qsort(ix->by_id, n, sizeof *ix->by_id, cmp_id_key);
    for (size_t i = 0; i < n; i++) {
        const struct plx_vdi_info *v = &f->vdis[i];
        if (is_live(ix, i) && source_snap(ix, i) != NULL)
            ix->clones[ix->clone_count++] = (struct clone_key){
                .parent_id = v->parent_id, .parent_snap = v->parent_snap, .id = v->id, .idx = i};
    }
    qsort(ix->clones, ix->clone_count, sizeof *ix->clones, cmp_clone_key);
    return 0;
}

/* The clones made from snapshot N of VDI `id`: *count entries from the returned one. */
static const struct clone_key *clones_of(const struct forest_index *ix, uint64_t id, uint64_t n,
                                         size_t *count)
{
    struct clone_key key = {.parent_id = id, .parent_snap = n, .id = 0};
    size_t lo = 0, hi = ix->clone_count;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cmp_clone_key(&ix->clones[mid], &key) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *count = 0;
    while (lo + *count < ix->clone_count && ix->clones[lo + *count].parent_id == id &&
           ix->clones[lo + *count].parent_snap == n)
        (*count)++;
    return &ix->clones[lo];
}

static void vdi_label(const struct forest_index *ix, size_t vi, char *buf, size_t len)
{
    const struct plx_vdi_info *v = &ix->f->vdis[vi];
    size_t pi;

    if (v->parent_id == 0 || source_snap(ix, vi) != NULL) {
        snprintf(buf, len, "%s (id %llu)", v->name, (unsigned long long)v->id);
        return;
    }
    /* An orphaned clone: say where it came from, since the drawing cannot. */
    pi = find_vdi(ix, v->parent_id);
    if (pi == SIZE_MAX)
        snprintf(buf, len, "%s (id %llu, parent %llu@%llu missing)", v->name,
                 (unsigned long long)v->id, (unsigned long long)v->parent_id,
                 (unsigned long long)v->parent_snap);
    else
        snprintf(buf, len, "%s (id %llu, parent %s@%llu deleted)", v->name,
                 (unsigned long long)v->id, ix->f->vdis[pi].name,
                 (unsigned long long)v->parent_snap);
}

static void snap_label(const struct plx_snap_info *s, char sep, char *buf, size_t len)
{
    char when[TIMEFMT_LEN];

    time_format_ns(s->time_ns, when, sizeof when);
    if (s->label[0] != '\0')
        snprintf(buf, len, "@%llu %s%c%s", (unsigned long long)s->index, s->label, sep, when);
    else
        snprintf(buf, len, "@%llu%c%s", (unsigned long long)s->index, sep, when);
}

/* ---- text --------------------------------------------------------------------------------- */

/* A control character in a name would break the drawing's lines. */
static void hide_controls(char *s)
{
    for (; *s != '\0'; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            *s = '?';
}

struct text_out {
    FILE *out;
    struct forest_index *ix;
    char *prefix; /* sized for the deepest possible chain, so it never grows */
    size_t len;
};

static size_t prefix_push(struct text_out *t, const char *s)
{
    size_t saved = t->len;

    strcpy(t->prefix + t->len, s);
    t->len += strlen(s);
    return saved;
}

static void prefix_pop(struct text_out *t, size_t saved)
{
    t->len = saved;
    t->prefix[saved] = '\0';
}

static void text_vdi(struct text_out *t, size_t vi, const char *branch, const char *cont);

static void text_snap(struct text_out *t, uint64_t vdi_id, const struct plx_snap_info *s, int last)
{
    char label[LABEL_MAX];
    size_t n;
    const struct clone_key *c = clones_of(t->ix, vdi_id, s->index, &n);

    snap_label(s, ' ', label, sizeof label);
    hide_controls(label);
    fprintf(t->out, "%s%s%s\n", t->prefix, last ? LAST : TEE, label);
    size_t saved = prefix_push(t, last ? SPACE : BAR);
    for (size_t i = 0; i < n; i++)
        if (!t->ix->drawn[c[i].idx])
            text_vdi(t, c[i].idx, i + 1 == n ? LAST : TEE, i + 1 == n ? SPACE : BAR);
    prefix_pop(t, saved);
}

static void text_vdi(struct text_out *t, size_t vi, const char *branch, const char *cont)
{
    const struct tree_forest *f = t->ix->f;
    size_t count, last = SIZE_MAX;
    const struct plx_snap_info *log = snap_log(f, vi, &count);
    char label[LABEL_MAX];

    t->ix->drawn[vi] = 1;
    vdi_label(t->ix, vi, label, sizeof label);
    hide_controls(label);
    fprintf(t->out, "%s%s%s\n", t->prefix, branch, label);
    for (size_t k = 0; k < count; k++)
        if (!log[k].deleted)
            last = k;
    size_t saved = prefix_push(t, cont);
    for (size_t k = 0; k < count; k++)
        if (!log[k].deleted)
            text_snap(t, f->vdis[vi].id, &log[k], k == last);
    prefix_pop(t, saved);
}

int tree_print_text(FILE *out, const struct tree_forest *f)
{
    struct forest_index ix;
    struct text_out t = {.out = out, .ix = &ix};

    if (index_build(&ix, f) < 0)
        return -ENOMEM;
    /* Each VDI in a chain adds at most two levels of at most strlen(BAR) bytes. */
    t.prefix = calloc(2 * strlen(BAR) * (f->vdi_count + 1) + 1, 1);
    if (t.prefix == NULL) {
        index_free(&ix);
        return -ENOMEM;
    }
    for (size_t k = 0; k < f->vdi_count; k++) {
        size_t vi = ix.by_id[k].idx;
        if (is_live(&ix, vi) && source_snap(&ix, vi) == NULL)
            text_vdi(&t, vi, "", "");
    }
    /* Only a cycle of parent links (corrupt registry) leaves live VDIs undrawn by now. */
    for (size_t k = 0; k < f->vdi_count; k++) {
        size_t vi = ix.by_id[k].idx;
        if (is_live(&ix, vi) && !ix.drawn[vi])
            text_vdi(&t, vi, "", "");
    }
    free(t.prefix);
    index_free(&ix);
    return 0;
}

/* ---- Graphviz ----------------------------------------------------------------------------- */

static void dot_escaped(FILE *out, const char *s)
{
    while (*s != '\0') {
        unsigned char c = (unsigned char)*s;
        size_t n = c >= 0x80 ? utf8_seq_len(s) : 1;
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", out);
        else if (c < 0x20 || c == 0x7f || n == 0)
            fputc('?', out); /* dot rejects control bytes and may reject bad UTF-8 */
        else
            fwrite(s, 1, n, out);
        s += n != 0 ? n : 1;
    }
}

static void dot_node(FILE *out, const char *id, const char *shape, const char *label)
{
    fprintf(out, "    %s [shape=%s, label=\"", id, shape);
    dot_escaped(out, label);
    fputs("\"];\n", out);
}

static void dot_vdi(FILE *out, const struct forest_index *ix, size_t vi)
{
    const struct tree_forest *f = ix->f;
    unsigned long long id = (unsigned long long)f->vdis[vi].id;
    char label[LABEL_MAX], node[64];
    size_t count;
    const struct plx_snap_info *log = snap_log(f, vi, &count);

    vdi_label(ix, vi, label, sizeof label);
    snprintf(node, sizeof node, "v%llu", id);
    dot_node(out, node, "box", label);
    for (size_t k = 0; k < count; k++) {
        const struct plx_snap_info *s = &log[k];
        if (s->deleted)
            continue;
        snap_label(s, '\n', label, sizeof label);
        snprintf(node, sizeof node, "v%llu_s%llu", id, (unsigned long long)s->index);
        dot_node(out, node, "ellipse", label);
        fprintf(out, "    v%llu -> %s;\n", id, node);
    }
}

int tree_print_dot(FILE *out, const struct tree_forest *f)
{
    struct forest_index ix;

    if (index_build(&ix, f) < 0)
        return -ENOMEM;
    fputs("digraph parallax {\n    ordering=out;\n    node [fontname=\"Helvetica\"];\n", out);
    for (size_t k = 0; k < f->vdi_count; k++)
        if (is_live(&ix, ix.by_id[k].idx))
            dot_vdi(out, &ix, ix.by_id[k].idx);
    for (size_t i = 0; i < ix.clone_count; i++)
        fprintf(out, "    v%llu_s%llu -> v%llu;\n", (unsigned long long)ix.clones[i].parent_id,
                (unsigned long long)ix.clones[i].parent_snap, (unsigned long long)ix.clones[i].id);
    fputs("}\n", out);
    index_free(&ix);
    return 0;
}

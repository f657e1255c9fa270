/*
 * check_report.c - the consistency checker's report (check_shared.h): each problem as a line
 * for the caller, at most CK_MAX_LINES of them, progress, and the names it gives to trees,
 * extent types and the places a reference comes from.
 */
#include <stdarg.h>
#include <stdio.h>
#include "check_shared.h"

void ck_progress(const struct ck *c, const char *step, uint64_t done, uint64_t total)
{
    if (c->progress)
        c->progress(c->progress_arg, step, done, total);
}

void ck_problem(struct ck *c, int is_error, const char *fmt, ...)
{
    if (is_error)
        c->out->errors++;
    if (!c->report)
        return;
    if (c->lines >= CK_MAX_LINES) {
        c->suppressed++;
        return;
    }
    c->lines++;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    c->report(c->arg, is_error, line);
}

const char *ck_type_name(unsigned t)
{
    switch (t) {
    case PLX_EXTENT_UNUSED:
        return "unused";
    case PLX_EXTENT_SYSTEM:
        return "system";
    case PLX_EXTENT_METADATA:
        return "metadata";
    case PLX_EXTENT_DATA:
        return "data";
    default:
        return "invalid";
    }
}

void ck_tree_name(const struct ck *c, size_t t, char *buf, size_t len)
{
    const struct ck_tree *tr = &c->trees[t];
    if (tr->snap)
        snprintf(buf, len, "snapshot %s@%llu", c->vdis[tr->vdi].name, (unsigned long long)tr->snap);
    else
        snprintf(buf, len, "VDI %s", c->vdis[tr->vdi].name);
}

void ck_ref_text(const struct ck *c, const struct ck_ref *r, char *buf, size_t len)
{
    char tn[PLX_NAME_MAX + 40];
    switch (r->kind) {
    case REF_NODE:
        ck_tree_name(c, r->tree, tn, sizeof tn);
        snprintf(buf, len, "radix node %llu (level %u) entry %u in the tree of %s",
                 (unsigned long long)r->node, r->level, r->idx, tn);
        break;
    case REF_CUR_ROOT:
    case REF_SNAP_ROOT:
        ck_tree_name(c, r->tree, tn, sizeof tn);
        snprintf(buf, len, "the root of %s", tn);
        break;
    case REF_LOG:
        snprintf(buf, len, "the snapshot log of VDI %s", c->vdis[r->vdi].name);
        break;
    case REF_REGISTRY:
        snprintf(buf, len, "the VDI registry");
        break;
    case REF_LIDX:
        snprintf(buf, len, "the label index of VDI %s", c->vdis[r->vdi].name);
        break;
    }
}

/* What a block that must be private is, for the message about it being shared. */
void ck_block_role(const struct ck *c, uint64_t a, char *buf, size_t len)
{
    buf[0] = 0;
    for (size_t t = 0; t < c->ntrees; t++) {
        if (c->trees[t].snap == 0 && c->trees[t].root == a) {
            snprintf(buf, len, "; it is the current root of VDI %s, which must be private",
                     c->vdis[c->trees[t].vdi].name);
            return;
        }
    }
    for (size_t i = 0; i < c->nlogs; i++) {
        if (c->logs[i].addr == a) {
            snprintf(buf, len, "; it is a snapshot log block of VDI %s",
                     c->vdis[c->logs[i].vdi].name);
            return;
        }
    }
}

/*
 * arbiter.c - which of several parallax-lockd instances is the active one, decided on the LUN
 * with SCSI-3 persistent reservation keys (docs/DESIGN.md "The lock manager", "Fail-over").
 *
 * The target is the arbiter: every PERSISTENT RESERVE OUT is carried out atomically there, and
 * two of them are compare-and-swap operations on a key:
 *   - REGISTER with our key K and a new key K' succeeds only while K is still registered for
 *     our session (else RESERVATION CONFLICT);
 *   - PREEMPT of key V succeeds only while V is registered, and only from a session that is
 *     registered itself.
 *
 * The active instance holds a key ("PLKD" in its upper half, lockd/arbiter.h) and renews it
 * every period by changing it (REGISTER K -> K'). A renewal that succeeds proves that nobody
 * preempted us up to then: we may grant for one window after it STARTED. A standby holds no key;
 * it reads the keys every period, and when every lockd key it sees has stayed unchanged for the
 * stale time (the active one is dead, frozen or cut off from the LUN), it takes over: it
 * registers a key of its own, preempts each stale key (each preempt fails if that key changed
 * meanwhile), then reads the keys again. It is active only if its own key is there and no other
 * lockd key is; otherwise it removes its key again and stays a standby (two candidates that see
 * each other both back off, and try again after a random delay). With no lockd key at all (the
 * first start, or after the active one stepped down) a standby does the same without preempting.
 *
 * Why at most one instance grants at a time: an instance that became active at time p (its
 * proving read completed) grants nothing before p + window (lockd.c). Every check that let
 * another instance grant (a renewal, or its own proving read) was carried out at the target
 * before p: after p that instance's key is gone or a later candidate saw ours, so a later check
 * fails; and it grants only until its last check's start + window < p + window. Nothing here
 * depends on how long the stale time is (that decides only how soon a dead instance is replaced,
 * and how rarely a live one is replaced needlessly); it does assume the clocks of the hosts run
 * at the same rate (not that they agree), as every lease does.
 *
 * One command at a time on a thread of its own (a slow target must not stop the lockd's poll
 * loop from answering heartbeats); the main thread reads the outcome (arb_get).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>

#include "arbiter.h"

#define PR_TYPE SCSI_PERSISTENT_RESERVE_TYPE_WRITE_EXCLUSIVE_REGISTRANTS_ONLY
#define PR_KEYS_BYTES 16384
#define MAX_TRACKED 32

static struct arb_config cfg;
static char url[512], id[64], initiator[160];
static uint16_t inst;
static pthread_t thread;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static struct arb_view view;    /* under mu */
static bool stop_req, down_req; /* under mu */

/* Thread-only state. */
static struct iscsi_context *ctx;
static int lun;
static uint64_t key, ctr;
/* A renewal sent but not answered (the session failed): the target may have made it our key. */
static uint64_t pending;
static struct {
    uint64_t key, first_seen_ns;
} seen[MAX_TRACKED];
static int nseen;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Log a line, without libiscsi's trailing newlines; the same line again only once a minute (a
 * target that is down fails every period the same way). */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    static char last[600];
    static uint64_t last_ns;
    char line[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    for (char *p = line; (p = strchr(p, '\n'));)
        *p = ' ';
    size_t n = strlen(line);
    while (n && line[n - 1] == ' ')
        line[--n] = 0;
    uint64_t now = now_ns();
    if (!strcmp(line, last) && now - last_ns < 60000000000ull)
        return;
    snprintf(last, sizeof last, "%s", line);
    last_ns = now;
    fprintf(stderr, "parallax-lockd: %s\n", line);
}

static bool is_lockd_key(uint64_t k)
{
    return (uint32_t)(k >> 32) == ARB_KEY_MAGIC;
}

static uint64_t make_key(void)
{
    ctr = (ctr + 1) & 0xffff;
    return (uint64_t)ARB_KEY_MAGIC << 32 | (uint64_t)inst << 16 | ctr;
}

/* One command (or the login) at a time, waited for with a deadline on the context's socket.
 * libiscsi's own synchronous calls keep their completion state on the caller's stack, and a
 * context destroyed after one of them failed may still call back into it; ours lives here, and
 * a task that comes back after we gave up on it is freed by the callback. */
static struct {
    bool done, abandoned;
    int status;
    struct scsi_task *task;
} cmd;

static void cmd_cb(struct iscsi_context *c, int status, void *data, void *priv)
{
    (void)c;
    (void)priv;
    if (cmd.abandoned) {
        if (data)
            scsi_free_scsi_task(data);
        return;
    }
    cmd.done = true;
    cmd.status = status;
    cmd.task = data;
}

static void connect_cb(struct iscsi_context *c, int status, void *data, void *priv)
{
    (void)c;
    (void)data;
    (void)priv;
    if (!cmd.abandoned) {
        cmd.done = true;
        cmd.status = status;
    }
}

static void disconnect(void)
{
    if (ctx) {
        cmd.abandoned = true; /* callbacks from inside the destroy free what they get */
        iscsi_destroy_context(ctx);
    }
    ctx = NULL;
}

/* Run the context until the command started last completes: 0, or -1 (the session is dropped:
 * it failed, or did not answer within half a window). */
static int await_cmd(const char *what)
{
    uint64_t deadline = now_ns() + cfg.window_ns / 2;
    while (!cmd.done) {
        uint64_t now = now_ns();
        if (now >= deadline) {
            say("the LUN did not answer %s within %.1f s", what, (double)cfg.window_ns / 2e9);
            disconnect();
            return -1;
        }
        struct pollfd p = {.fd = iscsi_get_fd(ctx), .events = (short)iscsi_which_events(ctx)};
        int r = poll(&p, 1, (int)((deadline - now) / 1000000) + 1);
        if (r < 0 && errno != EINTR) {
            disconnect();
            return -1;
        }
        if (iscsi_service(ctx, r > 0 ? p.revents : 0) < 0) {
            say("the LUN, %s: %s", what, iscsi_get_error(ctx));
            disconnect();
            return -1;
        }
    }
    return 0;
}

static void cmd_start(void)
{
    cmd.done = cmd.abandoned = false;
    cmd.status = -1;
    cmd.task = NULL;
}

static int connect_lun(void)
{
    ctx = iscsi_create_context(initiator);
    if (!ctx)
        return -1;
    struct iscsi_url *u = iscsi_parse_full_url(ctx, url);
    if (!u) {
        say("the LUN '%s': %s", url, iscsi_get_error(ctx));
        disconnect();
        return -1;
    }
    iscsi_set_targetname(ctx, u->target);
    iscsi_set_session_type(ctx, ISCSI_SESSION_NORMAL);
    iscsi_set_header_digest(ctx, ISCSI_HEADER_DIGEST_NONE_CRC32C);
    if (u->user[0])
        iscsi_set_initiator_username_pwd(ctx, u->user, u->passwd);
    iscsi_set_noautoreconnect(ctx, 1);
    iscsi_set_tcp_syncnt(ctx, 3);
    lun = u->lun;
    cmd_start();
    int rc = iscsi_full_connect_async(ctx, u->portal, u->lun, connect_cb, NULL);
    iscsi_destroy_url(u);
    if (rc == 0)
        rc = await_cmd("the login");
    else
        disconnect();
    if (rc == 0 && cmd.status != SCSI_STATUS_GOOD) {
        say("cannot log in to the LUN %s: %s", cfg.url, iscsi_get_error(ctx));
        disconnect();
        rc = -1;
    }
    return rc;
}

static bool retryable(const struct scsi_task *t)
{
    return t->status == SCSI_STATUS_BUSY ||
           (t->status == SCSI_STATUS_CHECK_CONDITION && t->sense.key == SCSI_SENSE_UNIT_ATTENTION);
}

/* PERSISTENT RESERVE OUT: the SCSI status, or -1 when the session failed (it is dropped). */
static int pr_out(int sa, uint64_t k, uint64_t sa_key)
{
    for (int i = 0; ctx; i++) {
        struct scsi_persistent_reserve_out_basic p = {.reservation_key = k,
                                                      .service_action_reservation_key = sa_key};
        cmd_start();
        if (!iscsi_persistent_reserve_out_task(ctx, lun, sa, SCSI_PERSISTENT_RESERVE_SCOPE_LU,
                                               PR_TYPE, &p, cmd_cb, NULL) ||
            await_cmd("PERSISTENT RESERVE OUT") < 0) {
            disconnect();
            return -1;
        }
        struct scsi_task *t = cmd.task;
        int status = t ? t->status : -1;
        bool again = t && retryable(t) && i < 3;
        if (t)
            scsi_free_scsi_task(t);
        if (!again)
            return status;
    }
    return -1;
}

/* READ KEYS: the lockd keys among them into keys[] (at most max): how many, or -1 (the session
 * is dropped on failure). */
static int read_keys(uint64_t *keys, int max)
{
    for (int i = 0; ctx; i++) {
        cmd_start();
        if (!iscsi_persistent_reserve_in_task(ctx, lun, SCSI_PERSISTENT_RESERVE_READ_KEYS,
                                              PR_KEYS_BYTES, cmd_cb, NULL) ||
            await_cmd("PERSISTENT RESERVE IN") < 0) {
            disconnect();
            return -1;
        }
        struct scsi_task *t = cmd.task;
        if (t && t->status == SCSI_STATUS_GOOD) {
            const struct scsi_persistent_reserve_in_read_keys *rk = scsi_datain_unmarshall(t);
            int n = -1;
            if (rk) {
                n = 0;
                for (int k = 0; k < rk->num_keys; k++)
                    if (is_lockd_key(rk->keys[k]) && n < max)
                        keys[n++] = rk->keys[k];
            }
            scsi_free_scsi_task(t);
            return n;
        }
        bool again = t && retryable(t) && i < 3;
        if (t)
            scsi_free_scsi_task(t);
        if (!again)
            return -1;
    }
    return -1;
}

static void publish(bool active, uint64_t since, uint64_t valid_until)
{
    pthread_mutex_lock(&mu);
    if (active && !view.active)
        view.generation++;
    view.active = active;
    view.since_ns = since;
    view.valid_until_ns = valid_until;
    view.key = key;
    pthread_mutex_unlock(&mu);
}

/* Remove our key (a REGISTER to 0: itself refused when we were preempted). */
static void drop_key(void)
{
    if (key && ctx)
        pr_out(SCSI_PERSISTENT_RESERVE_REGISTER, key, 0);
    key = 0;
}

/* Register a key, preempt the stale ones, and read: active when ours is the only lockd key. */
static void try_become_active(const uint64_t *stale, int nstale)
{
    key = make_key();
    if (pr_out(SCSI_PERSISTENT_RESERVE_REGISTER_AND_IGNORE_EXISTING_KEY, 0, key) !=
        SCSI_STATUS_GOOD) {
        key = 0;
        return;
    }
    for (int i = 0; i < nstale; i++) {
        int status = pr_out(SCSI_PERSISTENT_RESERVE_PREEMPT, key, stale[i]);
        if (status == SCSI_STATUS_GOOD)
            say("preempted the key %016llx of a lock manager that stopped renewing it",
                (unsigned long long)stale[i]);
        else if (status < 0)
            break;
        /* RESERVATION CONFLICT: that key changed or went away meanwhile; the read tells. */
    }
    uint64_t keys[MAX_TRACKED];
    uint64_t t0 = now_ns();
    int n = read_keys(keys, MAX_TRACKED);
    /* Our key once: two instances given the same --id could draw the same key, and each would
     * take the other's registration for its own. */
    int mine = 0;
    bool others = false;
    for (int i = 0; i < n; i++) {
        if (keys[i] == key)
            mine++;
        else
            others = true;
    }
    if (n >= 0 && mine == 1 && !others) {
        uint64_t now = now_ns();
        say("the LUN made this lock manager the active one (key %016llx)", (unsigned long long)key);
        publish(true, now, t0 + cfg.window_ns);
        nseen = 0;
        return;
    }
    if (n >= 0)
        say("backing off: another lock manager is taking over too");
    drop_key();
}

/* A standby's pass: read the keys, note which changed, take over when all are stale. */
static void standby_pass(void)
{
    uint64_t keys[MAX_TRACKED];
    int n = read_keys(keys, MAX_TRACKED);
    if (n < 0)
        return;
    uint64_t now = now_ns();
    /* Keep the first time each key value was seen; forget values that are gone. */
    int kept = 0;
    uint64_t first[MAX_TRACKED];
    for (int i = 0; i < n; i++) {
        first[i] = now;
        for (int j = 0; j < nseen; j++)
            if (seen[j].key == keys[i])
                first[i] = seen[j].first_seen_ns;
    }
    for (int i = 0; i < n; i++) {
        seen[kept].key = keys[i];
        seen[kept++].first_seen_ns = first[i];
    }
    nseen = kept;
    if (n == 0) {
        /* Nobody is active: become it, after a random part of a period (two that start at
         * once, or back off together, and see each other both back off; this keeps them from
         * meeting again). */
        usleep((useconds_t)((uint64_t)(rand() % 1000) * (cfg.period_ns / 1000000)));
        try_become_active(NULL, 0);
        return;
    }
    for (int i = 0; i < nseen; i++)
        if (now - seen[i].first_seen_ns < cfg.stale_ns)
            return; /* somebody renews: the active one is alive */
    try_become_active(keys, n);
}

static void active_pass(void)
{
    if (!key) {
        publish(false, 0, 0);
        return;
    }
    uint64_t t0 = now_ns(), next = make_key();
    pending = next;
    int status = pr_out(SCSI_PERSISTENT_RESERVE_REGISTER, key, next);
    if (status >= 0)
        pending = 0;
    if (status == SCSI_STATUS_GOOD) {
        key = next;
        pthread_mutex_lock(&mu);
        view.valid_until_ns = t0 + cfg.window_ns;
        view.key = key;
        pthread_mutex_unlock(&mu);
        return;
    }
    if (status == SCSI_STATUS_RESERVATION_CONFLICT) {
        /* Preempted (or our session was replaced, which the target counts the same way). */
        say("no longer active: our key %016llx is gone from the LUN (another lock manager "
            "took over)",
            (unsigned long long)key);
        key = 0;
        publish(false, 0, 0);
    }
    /* Else the target did not answer: the window runs out by itself (lockd.c steps down). */
}

/* Active, and the session was lost and logged in again: a new session is not registered (the
 * old one's registration stays behind, or the target forgot it in a restart). Our key is taken
 * again as a candidate takes over: register a new key, preempt our old one (and a renewal whose
 * answer was lost), and read. Only our key: still active, valid from this read, without the
 * wait of a new active one: any other instance that might grant would have its key there, or
 * had it removed by a preempt only after it was stale for a window, or by itself when it
 * stopped granting (docs/DESIGN.md, "Fail-over"). Else we step down. */
static void rejoin(void)
{
    uint64_t old = key, lost = pending, next = make_key();
    pending = 0;
    if (pr_out(SCSI_PERSISTENT_RESERVE_REGISTER_AND_IGNORE_EXISTING_KEY, 0, next) !=
        SCSI_STATUS_GOOD) {
        if (ctx) { /* refused: as if preempted */
            key = 0;
            publish(false, 0, 0);
        }
        return;
    }
    key = next;
    if (pr_out(SCSI_PERSISTENT_RESERVE_PREEMPT, key, old) < 0 ||
        (lost && pr_out(SCSI_PERSISTENT_RESERVE_PREEMPT, key, lost) < 0))
        return; /* the session failed again: the next pass logs in again and retries */
    uint64_t keys[MAX_TRACKED];
    uint64_t t0 = now_ns();
    int n = read_keys(keys, MAX_TRACKED);
    if (n < 0)
        return;
    int mine = 0;
    for (int i = 0; i < n; i++)
        mine += keys[i] == key;
    if (mine == 1 && n == 1) {
        say("still active after logging in to the LUN again (key %016llx)",
            (unsigned long long)key);
        pthread_mutex_lock(&mu);
        view.valid_until_ns = t0 + cfg.window_ns;
        view.key = key;
        pthread_mutex_unlock(&mu);
        return;
    }
    say("no longer active: another lock manager took over while our session to the LUN was "
        "down");
    drop_key();
    publish(false, 0, 0);
}

static void *run(void *arg)
{
    (void)arg;
    /* SIGTERM and SIGINT are the main thread's: its poll wakes for them. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    for (;;) {
        pthread_mutex_lock(&mu);
        bool stop = stop_req, down = down_req;
        down_req = false;
        bool active = view.active;
        pthread_mutex_unlock(&mu);
        if (stop)
            break;
        /* A new session is not registered: a renewal from it (REGISTER with our nonzero key) is
         * refused, so the key is kept. It must never become 0 while active: a REGISTER with key
         * 0 from an unregistered session registers the new key unconditionally. */
        if (down && active) {
            drop_key(); /* without a session the old one's registration stays: it goes stale */
            publish(false, 0, 0);
        } else if (!ctx) {
            if (connect_lun() == 0 && active)
                rejoin();
        } else if (active) {
            active_pass();
            /* The session failed under the renewal: log in again at once, within the window. */
            if (!ctx && view.active && connect_lun() == 0)
                rejoin();
        } else {
            standby_pass();
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t until = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + cfg.period_ns;
        ts.tv_sec = (time_t)(until / 1000000000ull);
        ts.tv_nsec = (long)(until % 1000000000ull);
        pthread_mutex_lock(&mu);
        while (!stop_req && !down_req && pthread_cond_timedwait(&cv, &mu, &ts) != ETIMEDOUT)
            ;
        pthread_mutex_unlock(&mu);
    }
    if (view.active)
        drop_key();
    disconnect();
    return NULL;
}

int arb_start(const struct arb_config *c, char *err, size_t errlen)
{
    cfg = *c;
    snprintf(url, sizeof url, "%s", c->url);
    snprintf(id, sizeof id, "%s", c->id);
    cfg.url = url;
    cfg.id = id;
    snprintf(initiator, sizeof initiator, "iqn.2026-11.org.parallax:lockd-%s", id);
    for (char *p = initiator; *p; p++)
        if (*p == ':' && p > initiator + 24)
            *p = '-';
    uint64_t h = 1469598103934665603ull;
    for (const char *p = id; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    inst = (uint16_t)(h ^ h >> 16 ^ h >> 32 ^ h >> 48);
    srand((unsigned)(h ^ (uint64_t)getpid() ^ now_ns()));
    ctr = (uint64_t)rand() & 0xffff;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = pthread_create(&thread, NULL, run, NULL);
    if (rc) {
        snprintf(err, errlen, "starting the arbiter thread: %s", strerror(rc));
        return -1;
    }
    return 0;
}

void arb_get(struct arb_view *v)
{
    pthread_mutex_lock(&mu);
    *v = view;
    pthread_mutex_unlock(&mu);
}

void arb_step_down(void)
{
    pthread_mutex_lock(&mu);
    down_req = true;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
}

void arb_stop(void)
{
    pthread_mutex_lock(&mu);
    stop_req = true;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(thread, NULL);
}

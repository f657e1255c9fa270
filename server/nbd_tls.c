/*
 * nbd_tls.c - GnuTLS sessions for the built-in NBD server; see nbd_tls.h.
 *
 * GnuTLS is loaded with dlopen() when a server starts with TLS, not linked: every `parallax`
 * command is this one binary, and linking GnuTLS made each of them load nine more libraries
 * and run GnuTLS's initialisation (some milliseconds) before main, which is most of what a
 * live snapshot through `parallax vdi-snapshot` may cost. The code below calls GnuTLS by its
 * own names; the macros after the pointer table route each call through the loaded library.
 */
#include "nbd_tls.h"

#include <dlfcn.h>
#include <errno.h>
#include <gnutls/gnutls.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define GNUTLS_SONAME "libgnutls.so.30"

/* Every GnuTLS function used here. */
#define GNUTLS_FUNCTIONS(X)                                                                        \
    X(gnutls_certificate_allocate_credentials)                                                     \
    X(gnutls_certificate_set_x509_trust_file)                                                      \
    X(gnutls_certificate_set_x509_crl_file)                                                        \
    X(gnutls_certificate_set_x509_key_file)                                                        \
    X(gnutls_certificate_free_credentials)                                                         \
    X(gnutls_certificate_server_set_request)                                                       \
    X(gnutls_certificate_verification_status_print)                                                \
    X(gnutls_psk_allocate_server_credentials)                                                      \
    X(gnutls_psk_set_server_credentials_file)                                                      \
    X(gnutls_psk_free_server_credentials)                                                          \
    X(gnutls_priority_init)                                                                        \
    X(gnutls_priority_deinit)                                                                      \
    X(gnutls_priority_set)                                                                         \
    X(gnutls_credentials_set)                                                                      \
    X(gnutls_init)                                                                                 \
    X(gnutls_deinit)                                                                               \
    X(gnutls_session_set_verify_cert)                                                              \
    X(gnutls_session_get_verify_cert_status)                                                       \
    X(gnutls_transport_set_ptr)                                                                    \
    X(gnutls_transport_set_push_function)                                                          \
    X(gnutls_transport_set_pull_function)                                                          \
    X(gnutls_handshake)                                                                            \
    X(gnutls_strerror)                                                                             \
    X(gnutls_record_get_direction)                                                                 \
    X(gnutls_record_recv)                                                                          \
    X(gnutls_record_send)                                                                          \
    X(gnutls_record_check_pending)

#define DECLARE_POINTER(f) static __typeof__(f) *p_##f;
GNUTLS_FUNCTIONS(DECLARE_POINTER)
static gnutls_free_function *p_gnutls_free; /* a variable in GnuTLS, not a function */

/* Load GnuTLS once; 0, or -ENOENT with the reason in err. */
static int gnutls_load(char *err, size_t errlen)
{
    static void *lib;
    if (lib)
        return 0;
    void *h = dlopen(GNUTLS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(err, errlen, "TLS needs GnuTLS (%s, Debian package libgnutls30): %s",
                 GNUTLS_SONAME, dlerror());
        return -ENOENT;
    }
    const char *missing = NULL;
#define LOAD_POINTER(f)                                                                            \
    if (!missing && !(*(void **)&p_##f = dlsym(h, #f)))                                            \
        missing = #f;
    GNUTLS_FUNCTIONS(LOAD_POINTER)
    if (!missing && !(p_gnutls_free = dlsym(h, "gnutls_free")))
        missing = "gnutls_free";
    if (missing) {
        snprintf(err, errlen, "%s has no %s: GnuTLS 3.7 or later is needed", GNUTLS_SONAME,
                 missing);
        dlclose(h);
        return -ENOENT;
    }
    lib = h;
    return 0;
}

/* From here on, GnuTLS's names call through the table. */
#define ROUTE(f) (*p_##f)
#define gnutls_certificate_allocate_credentials ROUTE(gnutls_certificate_allocate_credentials)
#define gnutls_certificate_set_x509_trust_file ROUTE(gnutls_certificate_set_x509_trust_file)
#define gnutls_certificate_set_x509_crl_file ROUTE(gnutls_certificate_set_x509_crl_file)
#define gnutls_certificate_set_x509_key_file ROUTE(gnutls_certificate_set_x509_key_file)
#define gnutls_certificate_free_credentials ROUTE(gnutls_certificate_free_credentials)
#define gnutls_certificate_server_set_request ROUTE(gnutls_certificate_server_set_request)
#define gnutls_certificate_verification_status_print                                              \
    ROUTE(gnutls_certificate_verification_status_print)
#define gnutls_psk_allocate_server_credentials ROUTE(gnutls_psk_allocate_server_credentials)
#define gnutls_psk_set_server_credentials_file ROUTE(gnutls_psk_set_server_credentials_file)
#define gnutls_psk_free_server_credentials ROUTE(gnutls_psk_free_server_credentials)
#define gnutls_priority_init ROUTE(gnutls_priority_init)
#define gnutls_priority_deinit ROUTE(gnutls_priority_deinit)
#define gnutls_priority_set ROUTE(gnutls_priority_set)
#define gnutls_credentials_set ROUTE(gnutls_credentials_set)
#define gnutls_init ROUTE(gnutls_init)
#define gnutls_deinit ROUTE(gnutls_deinit)
#define gnutls_session_set_verify_cert ROUTE(gnutls_session_set_verify_cert)
#define gnutls_session_get_verify_cert_status ROUTE(gnutls_session_get_verify_cert_status)
#define gnutls_transport_set_ptr ROUTE(gnutls_transport_set_ptr)
#define gnutls_transport_set_push_function ROUTE(gnutls_transport_set_push_function)
#define gnutls_transport_set_pull_function ROUTE(gnutls_transport_set_pull_function)
#define gnutls_handshake ROUTE(gnutls_handshake)
#define gnutls_strerror ROUTE(gnutls_strerror)
#define gnutls_record_get_direction ROUTE(gnutls_record_get_direction)
#define gnutls_record_recv ROUTE(gnutls_record_recv)
#define gnutls_record_send ROUTE(gnutls_record_send)
#define gnutls_record_check_pending ROUTE(gnutls_record_check_pending)
#undef gnutls_free
#define gnutls_free(p) (*p_gnutls_free)(p)

struct nbd_tls {
    gnutls_certificate_credentials_t x509; /* NULL without --tls-certificates */
    gnutls_psk_server_credentials_t psk;   /* NULL without --tls-psk */
    gnutls_priority_t prio;
    int verify_peer;
};

struct nbd_tls_session {
    gnutls_session_t s;
    int fd;
};

int nbd_tls_parse_mode(const char *s, enum nbd_tls_mode *out)
{
    if (strcmp(s, "off") == 0)
        *out = NBD_TLS_OFF;
    else if (strcmp(s, "on") == 0)
        *out = NBD_TLS_ON;
    else if (strcmp(s, "require") == 0)
        *out = NBD_TLS_REQUIRE;
    else
        return -EINVAL;
    return 0;
}

static int file_readable(const char *dir, const char *name, char *path, size_t len)
{
    snprintf(path, len, "%s/%s", dir, name);
    return access(path, R_OK) == 0;
}

static int load_x509(struct nbd_tls *t, const struct nbd_tls_config *cfg, char *err,
                     size_t errlen)
{
    char ca[4096], crl[4096], cert[4096], key[4096];
    int rc = gnutls_certificate_allocate_credentials(&t->x509);
    if (rc < 0) {
        snprintf(err, errlen, "TLS credentials: %s", gnutls_strerror(rc));
        return -ENOMEM;
    }
    int have_ca = file_readable(cfg->cert_dir, "ca-cert.pem", ca, sizeof ca);
    if (have_ca) {
        rc = gnutls_certificate_set_x509_trust_file(t->x509, ca, GNUTLS_X509_FMT_PEM);
        if (rc < 0) {
            snprintf(err, errlen, "%s: %s", ca, gnutls_strerror(rc));
            return -EINVAL;
        }
    } else if (cfg->verify_peer) {
        snprintf(err, errlen, "--tls-verify-peer needs %s (the CA that signs client certificates)",
                 ca);
        return -ENOENT;
    }
    if (file_readable(cfg->cert_dir, "ca-crl.pem", crl, sizeof crl)) {
        rc = gnutls_certificate_set_x509_crl_file(t->x509, crl, GNUTLS_X509_FMT_PEM);
        if (rc < 0) {
            snprintf(err, errlen, "%s: %s", crl, gnutls_strerror(rc));
            return -EINVAL;
        }
    }
    if (!file_readable(cfg->cert_dir, "server-cert.pem", cert, sizeof cert) ||
        !file_readable(cfg->cert_dir, "server-key.pem", key, sizeof key)) {
        snprintf(err, errlen, "--tls-certificates %s: server-cert.pem and server-key.pem must be readable there",
                 cfg->cert_dir);
        return -ENOENT;
    }
    rc = gnutls_certificate_set_x509_key_file(t->x509, cert, key, GNUTLS_X509_FMT_PEM);
    if (rc < 0) {
        snprintf(err, errlen, "%s, %s: %s", cert, key, gnutls_strerror(rc));
        return -EINVAL;
    }
    return 0;
}

static int load_psk(struct nbd_tls *t, const struct nbd_tls_config *cfg, char *err, size_t errlen)
{
    if (access(cfg->psk_file, R_OK) != 0) {
        int e = errno;
        snprintf(err, errlen, "--tls-psk %s: %s", cfg->psk_file, strerror(e));
        return -e;
    }
    int rc = gnutls_psk_allocate_server_credentials(&t->psk);
    if (rc < 0) {
        snprintf(err, errlen, "TLS credentials: %s", gnutls_strerror(rc));
        return -ENOMEM;
    }
    /* GnuTLS reads the file at each handshake (so keys can be rotated without a restart). */
    rc = gnutls_psk_set_server_credentials_file(t->psk, cfg->psk_file);
    if (rc < 0) {
        snprintf(err, errlen, "--tls-psk %s: %s", cfg->psk_file, gnutls_strerror(rc));
        return -EINVAL;
    }
    return 0;
}

int nbd_tls_new(const struct nbd_tls_config *cfg, struct nbd_tls **out, char *err, size_t errlen)
{
    *out = NULL;
    if (cfg->mode == NBD_TLS_OFF) {
        if (cfg->cert_dir || cfg->psk_file || cfg->verify_peer) {
            snprintf(err, errlen, "--tls-certificates, --tls-psk and --tls-verify-peer need --tls=on or --tls=require");
            return -EINVAL;
        }
        return 0;
    }
    if (!cfg->cert_dir && !cfg->psk_file) {
        snprintf(err, errlen, "--tls=%s needs --tls-certificates DIR or --tls-psk FILE",
                 cfg->mode == NBD_TLS_ON ? "on" : "require");
        return -EINVAL;
    }
    if (cfg->verify_peer && !cfg->cert_dir) {
        snprintf(err, errlen, "--tls-verify-peer verifies X.509 client certificates: it needs --tls-certificates DIR");
        return -EINVAL;
    }
    int lrc = gnutls_load(err, errlen);
    if (lrc)
        return lrc;
    struct nbd_tls *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    t->verify_peer = cfg->verify_peer;
    int rc = 0;
    if (cfg->cert_dir)
        rc = load_x509(t, cfg, err, errlen);
    if (rc == 0 && cfg->psk_file)
        rc = load_psk(t, cfg, err, errlen);
    if (rc == 0) {
        /* NORMAL, plus the PSK key exchanges when a PSK file is given (as nbdkit and qemu). */
        const char *prio = cfg->psk_file ? "NORMAL:+ECDHE-PSK:+DHE-PSK:+PSK" : "NORMAL";
        int g = gnutls_priority_init(&t->prio, prio, NULL);
        if (g < 0) {
            snprintf(err, errlen, "TLS priority %s: %s", prio, gnutls_strerror(g));
            rc = -EINVAL;
        }
    }
    if (rc) {
        nbd_tls_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void nbd_tls_free(struct nbd_tls *t)
{
    if (!t)
        return;
    if (t->prio)
        gnutls_priority_deinit(t->prio);
    if (t->x509)
        gnutls_certificate_free_credentials(t->x509);
    if (t->psk)
        gnutls_psk_free_server_credentials(t->psk);
    free(t);
}

/* GnuTLS's default push is send() without MSG_NOSIGNAL: a client that hangs up would raise
 * SIGPIPE. */
static ssize_t push(gnutls_transport_ptr_t p, const void *buf, size_t len)
{
    const struct nbd_tls_session *s = p;
    return send(s->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static ssize_t pull(gnutls_transport_ptr_t p, void *buf, size_t len)
{
    const struct nbd_tls_session *s = p;
    return recv(s->fd, buf, len, MSG_DONTWAIT);
}

int nbd_tls_session_new(struct nbd_tls *t, int fd, struct nbd_tls_session **out)
{
    struct nbd_tls_session *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->fd = fd;
    if (gnutls_init(&s->s, GNUTLS_SERVER | GNUTLS_NONBLOCK) < 0) {
        free(s);
        return -ENOMEM;
    }
    int rc = gnutls_priority_set(s->s, t->prio);
    if (rc == 0 && t->x509)
        rc = gnutls_credentials_set(s->s, GNUTLS_CRD_CERTIFICATE, t->x509);
    if (rc == 0 && t->psk)
        rc = gnutls_credentials_set(s->s, GNUTLS_CRD_PSK, t->psk);
    if (rc < 0) {
        nbd_tls_session_free(s);
        return -EINVAL;
    }
    if (t->verify_peer) {
        gnutls_certificate_server_set_request(s->s, GNUTLS_CERT_REQUIRE);
        /* Verified during the handshake: a client without a certificate the CA signed fails it. */
        gnutls_session_set_verify_cert(s->s, NULL, 0);
    }
    gnutls_transport_set_ptr(s->s, s);
    gnutls_transport_set_push_function(s->s, push);
    gnutls_transport_set_pull_function(s->s, pull);
    *out = s;
    return 0;
}

void nbd_tls_session_free(struct nbd_tls_session *s)
{
    if (!s)
        return;
    gnutls_deinit(s->s);
    free(s);
}

int nbd_tls_handshake(struct nbd_tls_session *s, char *err, size_t errlen)
{
    int rc;
    do
        rc = gnutls_handshake(s->s);
    while (rc == GNUTLS_E_INTERRUPTED);
    if (rc == GNUTLS_E_SUCCESS)
        return 0;
    if (rc == GNUTLS_E_AGAIN)
        return -EAGAIN;
    if (rc == GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR) {
        gnutls_datum_t why = {NULL, 0};
        unsigned status = gnutls_session_get_verify_cert_status(s->s);
        gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &why, 0);
        snprintf(err, errlen, "client certificate refused: %s", why.data ? (char *)why.data : "?");
        gnutls_free(why.data);
        return -EACCES;
    }
    snprintf(err, errlen, "%s", gnutls_strerror(rc));
    return -EPROTO;
}

int nbd_tls_wants_write(const struct nbd_tls_session *s)
{
    return gnutls_record_get_direction(s->s) == 1;
}

static ssize_t io_result(ssize_t r)
{
    if (r >= 0)
        return r;
    if (r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED)
        return -EAGAIN;
    if (r == GNUTLS_E_PREMATURE_TERMINATION)
        return 0; /* the client closed the socket without close_notify: end of stream */
    return -EIO;
}

ssize_t nbd_tls_recv(struct nbd_tls_session *s, void *buf, size_t len)
{
    return io_result(gnutls_record_recv(s->s, buf, len));
}

ssize_t nbd_tls_send(struct nbd_tls_session *s, const void *buf, size_t len)
{
    return io_result(gnutls_record_send(s->s, buf, len));
}

size_t nbd_tls_pending(const struct nbd_tls_session *s)
{
    return gnutls_record_check_pending(s->s);
}

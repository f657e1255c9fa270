/*
 * nbd_tls.h - TLS for the built-in NBD server (NBD_OPT_STARTTLS), through GnuTLS.
 *
 * The server's credentials are loaded once at start-up (X.509 certificates from a directory laid
 * out as nbdkit's --tls-certificates expects, and/or a PSK file in psktool's "identity:hexkey"
 * format). Each connection that sends NBD_OPT_STARTTLS gets a session over its non-blocking
 * socket; every call below returns at once (-EAGAIN when the socket is not ready), so the engine
 * thread never waits for a handshake or a record: the server's event loop calls again when the
 * socket is ready in the direction nbd_tls_wants_write() names.
 */
#ifndef PLX_NBD_TLS_H
#define PLX_NBD_TLS_H

#include <stddef.h>
#include <sys/types.h>

enum nbd_tls_mode {
    NBD_TLS_OFF,     /* NBD_OPT_STARTTLS is refused (unsupported) */
    NBD_TLS_ON,      /* clients may upgrade; plain clients are served too */
    NBD_TLS_REQUIRE, /* every option but STARTTLS and ABORT is refused before the upgrade */
};

struct nbd_tls_config {
    enum nbd_tls_mode mode;
    const char *cert_dir; /* ca-cert.pem (optional unless verify_peer), server-cert.pem, server-key.pem, ca-crl.pem (optional) */
    const char *psk_file; /* psktool format: one "identity:hexkey" per line */
    int verify_peer;      /* ask for a client certificate and verify it against ca-cert.pem */
};

struct nbd_tls;         /* the server's credentials */
struct nbd_tls_session; /* one connection's TLS session */

/* Parse --tls=off|on|require. 0 or -EINVAL. */
int nbd_tls_parse_mode(const char *s, enum nbd_tls_mode *out);
/* Check the configuration and load the credentials. *out stays NULL when mode is OFF. On error
 * returns a negative errno with a message in err naming the file and the GnuTLS reason. */
int nbd_tls_new(const struct nbd_tls_config *cfg, struct nbd_tls **out, char *err, size_t errlen);
void nbd_tls_free(struct nbd_tls *t);

/* A server session over the non-blocking socket fd (which stays owned by the caller). */
int nbd_tls_session_new(struct nbd_tls *t, int fd, struct nbd_tls_session **out);
void nbd_tls_session_free(struct nbd_tls_session *s);
/* Advance the handshake: 0 when it is complete, -EAGAIN when the socket must become ready
 * again (see nbd_tls_wants_write), another negative errno when it failed (message in err). */
int nbd_tls_handshake(struct nbd_tls_session *s, char *err, size_t errlen);
/* After -EAGAIN: nonzero when the session waits to write, zero when it waits to read. */
int nbd_tls_wants_write(const struct nbd_tls_session *s);
/* Record I/O: bytes moved, 0 at end of stream (recv), -EAGAIN, or -EIO/-ECONNRESET. After
 * -EAGAIN from send, the next send must pass the same buffer and length (GnuTLS's rule). */
ssize_t nbd_tls_recv(struct nbd_tls_session *s, void *buf, size_t len);
ssize_t nbd_tls_send(struct nbd_tls_session *s, const void *buf, size_t len);
/* Decrypted bytes GnuTLS holds that the socket will not signal again. */
size_t nbd_tls_pending(const struct nbd_tls_session *s);

#endif

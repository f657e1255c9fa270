#!/usr/bin/env bash
# `parallax serve` over TCP with TLS (NBD_OPT_STARTTLS, GnuTLS): X.509 certificates made here with
# certtool, and a PSK file made with psktool. Real clients (nbdinfo, nbdcopy, qemu-io, qemu-img)
# read and write through TLS; with --tls=require a client without TLS is refused and so is a
# wrong PSK; with --tls=on both are served; --tls-verify-peer refuses a client without a
# certificate the CA signed. A client that stalls in the middle of its handshake does not stop
# the server from serving another one (the handshake never blocks the engine thread).
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

require_cmd certtool psktool nbdinfo nbdcopy qemu-io qemu-img python3 cmp

T=$PLX_TEST_TMP
export PARALLAX_RUN_DIR=$T/run
mkdir -p "$PARALLAX_RUN_DIR"

# ---- credentials -------------------------------------------------------------------------------
pki=$T/pki      # the server's directory: ca-cert.pem, server-cert.pem, server-key.pem
cli=$T/client   # a client's: ca-cert.pem, client-cert.pem, client-key.pem (libnbd and qemu layout)
cacli=$T/caonly # a client with the CA only (no client certificate)
mkdir -p "$pki" "$cli" "$cacli" "$T/psk" "$T/badpsk"
certtool --generate-privkey --outfile "$pki/ca-key.pem" 2>/dev/null
printf 'cn = Parallax test CA\nca\ncert_signing_key\nexpiration_days = 2\n' >"$T/ca.info"
certtool --generate-self-signed --load-privkey "$pki/ca-key.pem" --template "$T/ca.info" \
    --outfile "$pki/ca-cert.pem" 2>/dev/null
certtool --generate-privkey --outfile "$pki/server-key.pem" 2>/dev/null
printf 'cn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\ntls_www_server\nencryption_key\nsigning_key\nexpiration_days = 2\n' >"$T/server.info"
certtool --generate-certificate --load-privkey "$pki/server-key.pem" --load-ca-certificate "$pki/ca-cert.pem" \
    --load-ca-privkey "$pki/ca-key.pem" --template "$T/server.info" --outfile "$pki/server-cert.pem" 2>/dev/null
certtool --generate-privkey --outfile "$cli/client-key.pem" 2>/dev/null
printf 'cn = client\ntls_www_client\nencryption_key\nsigning_key\nexpiration_days = 2\n' >"$T/client.info"
certtool --generate-certificate --load-privkey "$cli/client-key.pem" --load-ca-certificate "$pki/ca-cert.pem" \
    --load-ca-privkey "$pki/ca-key.pem" --template "$T/client.info" --outfile "$cli/client-cert.pem" 2>/dev/null
cp "$pki/ca-cert.pem" "$cli/" && cp "$pki/ca-cert.pem" "$cacli/"
[[ -s $pki/server-cert.pem && -s $cli/client-cert.pem ]] || fail "certtool made no certificates"
psktool -u alice -p "$T/psk/keys.psk" >/dev/null
psktool -u alice -p "$T/badpsk/keys.psk" >/dev/null # same identity, another key
cmp -s "$T/psk/keys.psk" "$T/badpsk/keys.psk" && fail "psktool made the same key twice"

# GnuTLS is loaded only by a server started with TLS: short commands do not pay for it.
if ldd "$PARALLAX" | contains libgnutls; then fail "parallax links GnuTLS (it must dlopen it)"; fi

plx format --size 1G --extent-size 16M >/dev/null
plx vdi-create disk --size 64M >/dev/null

# A port number nothing listens on, for the refusals below (nothing is ever served on it).
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# start_server ARGS...: serve on a TCP port of 127.0.0.1 the kernel picks (--port 0; the server
# names it on stderr), so that no other process's listener can be mistaken for ours; sets PORT
# and SERVER_PID.
start_server() {
    local i before
    : >>"$T/serve.log" # exists before the loop reads it (the server opens it when it has forked)
    before=$(grep -c "^parallax: serve: listening on" "$T/serve.log" 2>/dev/null || true)
    "$PARALLAX" -b "$T/store.img" serve --port 0 "$@" >>"$T/serve.log" 2>&1 &
    SERVER_PID=$!
    bg_pid "$SERVER_PID"
    for ((i = 0; i < 100; i++)); do
        PORT=$(sed -n 's/^parallax: serve: listening on 127.0.0.1 port \([0-9]*\)$/\1/p' \
            "$T/serve.log" | sed -n "$((${before:-0} + 1))p")
        [[ -n $PORT ]] && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$T/serve.log" >&2; fail "server exited: $*"; }
        sleep 0.1
    done
    fail "server did not listen within 10 s"
}
stop_server() {
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID" || true
}
x509_uri() { echo "nbds://localhost:$PORT/disk?tls-certificates=${2:-$cli}"; }
psk_uri() { echo "nbds://alice@localhost:$PORT/disk?tls-psk-file=$1/keys.psk"; }
plain_uri() { echo "nbd://localhost:$PORT/disk"; }
# qio_x509 CMD...: qemu-io over TLS with X.509 credentials from $cli.
qio_x509() {
    local a=() c out
    for c in "$@"; do a+=(-c "$c"); done
    out=$(qemu-io --object "tls-creds-x509,id=tls0,endpoint=client,dir=$cli" \
        --image-opts "driver=nbd,host=127.0.0.1,port=$PORT,export=disk,tls-creds=tls0" "${a[@]}" 2>&1) ||
        { printf '%s\n' "$out" >&2; fail "qemu-io over TLS: $*"; }
    if grep -Eqi 'fail|error' <<<"$out"; then
        printf '%s\n' "$out" >&2
        fail "qemu-io over TLS: $*"
    fi
}

# ---- bad configurations: clear errors, no server ---------------------------------------------
expect_fail 2 plx serve --port 1 --tls=maybe
grep -q "off, on or require" <<<"$PLX_LAST_STDERR" || fail "bad --tls value: $PLX_LAST_STDERR"
expect_fail 1 plx serve --port "$(free_port)" --tls=require
grep -q -- "--tls-certificates DIR or --tls-psk FILE" <<<"$PLX_LAST_STDERR" || fail "no credentials: $PLX_LAST_STDERR"
expect_fail 1 plx serve --port "$(free_port)" --tls=on --tls-certificates "$T/nowhere"
grep -q "server-cert.pem" <<<"$PLX_LAST_STDERR" || fail "missing certificates: $PLX_LAST_STDERR"
expect_fail 1 plx serve --port "$(free_port)" --tls=on --tls-psk "$T/psk/absent.psk"
grep -q "absent.psk" <<<"$PLX_LAST_STDERR" || fail "missing PSK file: $PLX_LAST_STDERR"
expect_fail 1 plx serve --port "$(free_port)" --tls-psk "$T/psk/keys.psk"
expect_fail 1 plx serve --port "$(free_port)" --tls=on --tls-psk "$T/psk/keys.psk" --tls-verify-peer

# ---- X.509, --tls=require ------------------------------------------------------------------------
start_server --tls=require --tls-certificates "$pki"
assert_eq 67108864 "$(nbdinfo --size "$(x509_uri)")" "size over TLS"
nbdinfo "$(x509_uri)" | contains "protocol:.*with TLS" || fail "nbdinfo does not report TLS"
qio_x509 "write -P 0x5a 16M 256k" "read -P 0x5a 16M 256k" "flush"
head -c 4M /dev/urandom >"$T/in.raw"
nbdcopy "$T/in.raw" "$(x509_uri)"
nbdcopy "$(x509_uri)" "$T/out.raw"
cmp -n $((4 << 20)) "$T/in.raw" "$T/out.raw" || fail "nbdcopy round trip over TLS differs"
qemu-img info --object "tls-creds-x509,id=tls0,endpoint=client,dir=$cli" \
    --image-opts "driver=nbd,host=127.0.0.1,port=$PORT,export=disk,tls-creds=tls0" >/dev/null ||
    fail "qemu-img info over TLS"
# Without TLS: refused.
if nbdinfo --size "$(plain_uri)" >"$T/plain.out" 2>&1; then fail "a client without TLS was served under --tls=require"; fi
grep -qi "tls" "$T/plain.out" || { cat "$T/plain.out" >&2; fail "the refusal does not mention TLS"; }
if qemu-img info "$(plain_uri)" >/dev/null 2>&1; then fail "qemu-img without TLS was served under --tls=require"; fi

# A client that stops in the middle of its handshake: the ACK of STARTTLS, then silence. The
# server must go on serving others meanwhile.
python3 - "$PORT" >"$T/stall.out" 2>&1 <<'PY' &
import socket, struct, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.recv(18)                                          # NBDMAGIC IHAVEOPT flags
s.sendall(struct.pack(">I", 3))                     # fixed newstyle, no zeroes
s.sendall(struct.pack(">QII", 0x49484156454f5054, 5, 0))  # NBD_OPT_STARTTLS
print("ack", s.recv(20).hex(), flush=True)
s.sendall(b"\x16\x03\x01")                          # three bytes of a ClientHello, then nothing
time.sleep(30)
PY
stall_pid=$!
bg_pid "$stall_pid"
for ((i = 0; i < 50; i++)); do grep -q '^ack' "$T/stall.out" && break; sleep 0.1; done
grep -q '^ack 0003e889045565a900000005000000010000' "$T/stall.out" || { cat "$T/stall.out" >&2; fail "STARTTLS not acknowledged"; }
timeout 10 nbdinfo --size "$(x509_uri)" >/dev/null || fail "a stalled handshake blocked the server"
kill "$stall_pid" 2>/dev/null; wait "$stall_pid" 2>/dev/null || true
stop_server

# ---- --tls=on: both kinds of clients ------------------------------------------------------------
start_server --tls=on --tls-certificates "$pki"
qio_x509 "read -P 0x5a 16M 256k"
out=$(qemu-io -f raw -c "read -P 0x5a 16M 256k" "$(plain_uri)" 2>&1) || fail "plain client under --tls=on: $out"
grep -Eqi 'fail|error' <<<"$out" && fail "plain client under --tls=on: $out"
stop_server

# ---- --tls-verify-peer ------------------------------------------------------------------------
start_server --tls=require --tls-certificates "$pki" --tls-verify-peer
assert_eq 67108864 "$(nbdinfo --size "$(x509_uri)")" "size with a client certificate"
if nbdinfo --size "$(x509_uri "" "$cacli")" >/dev/null 2>&1; then
    fail "a client without a certificate was served under --tls-verify-peer"
fi
grep -q "client certificate\|TLS handshake" "$T/serve.log" || fail "the refused handshake was not logged"
stop_server

# ---- PSK ------------------------------------------------------------------------------------------
start_server --tls=require --tls-psk "$T/psk/keys.psk"
assert_eq 67108864 "$(nbdinfo --size "$(psk_uri "$T/psk")")" "size over TLS-PSK"
nbdcopy "$(psk_uri "$T/psk")" "$T/out2.raw"
cmp -n $((4 << 20)) "$T/in.raw" "$T/out2.raw" || fail "read over TLS-PSK differs"
out=$(qemu-io --object "tls-creds-psk,id=tls0,endpoint=client,dir=$T/psk,username=alice" \
    --image-opts "driver=nbd,host=127.0.0.1,port=$PORT,export=disk,tls-creds=tls0" \
    -c "write -P 0x33 8M 64k" -c "read -P 0x33 8M 64k" 2>&1) || fail "qemu-io over TLS-PSK: $out"
grep -Eqi 'fail|error' <<<"$out" && fail "qemu-io over TLS-PSK: $out"
if nbdinfo --size "$(psk_uri "$T/badpsk")" >/dev/null 2>&1; then fail "a wrong PSK was accepted"; fi
if nbdinfo --size "$(plain_uri)" >/dev/null 2>&1; then fail "a client without TLS was served (PSK)"; fi
# The server is still fine after the refusals.
assert_eq 67108864 "$(nbdinfo --size "$(psk_uri "$T/psk")")" "size after refusals"
stop_server

# ---- --tls=off (the default) refuses STARTTLS ----------------------------------------------------
start_server
if nbdinfo --size "$(x509_uri)" >/dev/null 2>&1; then fail "a TLS client was served by a server without TLS"; fi
out=$(qemu-io -f raw -c "read -P 0x33 8M 64k" "$(plain_uri)" 2>&1) || fail "plain read: $out"
stop_server
plx check >/dev/null || fail "check after the TLS runs"
echo "nbd_tls: ok"

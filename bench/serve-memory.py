#!/usr/bin/env python3
"""bench/serve-memory.py - a `parallax serve` process's memory against the VDIs it serves.

    bench/serve-memory.py --parallax build/parallax --dir DIR [--counts 1,10,100,1000]

Formats a blockstore in DIR, creates max(counts) VDIs of 1 GiB, starts `parallax serve --unix`
(default 64 MiB node cache), and connects NBD clients (the fixed newstyle handshake, NBD_OPT_GO,
then one 4 KiB read at a spread offset, so each VDI is open for writing with its root and a path
of nodes cached) to 1, 10, ... VDIs, one connection each, all kept open. After each step it
reads the server's VmRSS from /proc. Prints CSV: vdis,rss_kib,kib_per_vdi_since_first.
The server is stopped by its pid at the end.
"""
import argparse, os, resource, signal, socket, struct, subprocess, sys, tempfile, time

def nbd_open(path, name):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    def recv(n):
        b = b""
        while len(b) < n:
            c = s.recv(n - len(b))
            if not c:
                raise RuntimeError("server closed the connection")
            b += c
        return b
    hdr = recv(18)
    if hdr[:16] != b"NBDMAGICIHAVEOPT":
        raise RuntimeError("not an NBD newstyle server")
    s.sendall(struct.pack(">I", 3))  # FIXED_NEWSTYLE | NO_ZEROES
    data = struct.pack(">I", len(name)) + name.encode() + struct.pack(">H", 0)
    s.sendall(b"IHAVEOPT" + struct.pack(">II", 7, len(data)) + data)  # NBD_OPT_GO
    while True:
        magic, opt, rtype, ln = struct.unpack(">QIII", recv(20))
        body = recv(ln)
        if rtype == 1:  # NBD_REP_ACK
            break
        if rtype & 0x80000000:
            raise RuntimeError("NBD_OPT_GO %s refused: %d %r" % (name, rtype, body))
    # one read: NBD_CMD_READ at offset 4096 * (hash of name), 4096 bytes
    off = (abs(hash(name)) % 262144) * 4096
    s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, 1, off, 4096))
    magic, err, handle = struct.unpack(">IIQ", recv(16))
    if magic == 0x67446698 and err == 0:
        recv(4096)
    elif magic == 0x668e33ef:  # structured reply: read the chunk(s)
        raise RuntimeError("structured replies were not negotiated; unexpected")
    else:
        raise RuntimeError("read on %s failed: %d" % (name, err))
    return s

def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--parallax", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--counts", default="1,10,100,1000")
    a = ap.parse_args()
    counts = [int(x) for x in a.counts.split(",")]
    # one socket per VDI on both sides (the server inherits the limit)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 2 * max(counts) + 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    work = tempfile.mkdtemp(prefix="plx-serve-mem.", dir=a.dir)
    store = os.path.join(work, "store")
    sock = os.path.join(work, "nbd.sock")
    env = dict(os.environ, PARALLAX_BLOCKSTORE=store, PARALLAX_RUN_DIR=work)
    subprocess.run([a.parallax, "format", "--size", "16G", "--extent-size", "256M"], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    for i in range(max(counts)):
        subprocess.run([a.parallax, "vdi-create", "m%d" % i, "--size", "1G"], env=env,
                       check=True, stdout=subprocess.DEVNULL)
    srv = subprocess.Popen([a.parallax, "serve", "--unix", sock], env=env)
    conns = []
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        base = rss_kib(srv.pid)
        print("vdis,rss_kib,kib_per_vdi_since_first")
        print("0,%d," % base)
        first = None
        for n in counts:
            while len(conns) < n:
                conns.append(nbd_open(sock, "m%d" % len(conns)))
            time.sleep(0.2)
            r = rss_kib(srv.pid)
            if first is None:
                first = (n, r)
                print("%d,%d," % (n, r))
            else:
                print("%d,%d,%.1f" % (n, r, (r - first[1]) / (n - first[0])))
            sys.stdout.flush()
    finally:
        for c in conns:
            c.close()
        srv.send_signal(signal.SIGTERM)
        try:
            srv.wait(timeout=60)
        except subprocess.TimeoutExpired:
            srv.kill()
        subprocess.run(["rm", "-rf", work])

main()

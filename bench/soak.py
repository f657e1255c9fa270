#!/usr/bin/env python3
"""A compressed month of a pool's life (bench/soak.sh starts tgtd and runs this; issue 30).

Hosts (`parallax serve` processes with their own host ids, hence their own iSCSI sessions) share
one LUN through parallax-lockd. VDIs are cloned from one golden snapshot and spread over the
hosts; every "hour" each VDI takes a few writes and a flush through its host, then a snapshot,
and only the newest --keep snapshots of each VDI are kept (the older ones are deleted); every
"day" `parallax gc` runs from another host id while every host keeps serving, and a few VDIs
migrate to another host (the client moves; the VDI is handed over). On one day a host is killed
with -9 (its VDIs move to the survivors once its lease has expired; it comes back the next day),
on another the active one of the lock managers is killed with -9 (with two or more, started with
--store, a standby takes over on the LUN; with one, it is restarted after an "hour", as an
operator would; either way it comes back an "hour" later).

Measured: the store's used blocks every hour (`parallax info --json`), what the live VDIs and
kept snapshots reach at every gc (gc's own count of reachable blocks) and what gc freed. Target:
used space within 1.2x of what is reachable plus one open extent per host, at every gc. At the
end every flushed byte of every VDI is read back through its host and compared with the model,
the newest kept snapshots of the first VDI likewise, and `parallax check` must be clean.
Python 3 standard library only."""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from nbdclient import NBD  # noqa: E402

BLOCK = 4096


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


class Pool:
    def __init__(self, a):
        self.a = a
        self.work = a.work
        self.env = dict(os.environ, PARALLAX_LOCK_TIMEOUT=str(a.lock_timeout))
        self.hosts = {}      # name -> Popen
        self.lockd = {}       # name -> Popen
        self.lockd_port = {}  # name -> port
        self.events = []     # (hour, what)

    # ---- processes ----------------------------------------------------------------------------
    def host_env(self, host):
        """A host's environment: its id and its own run directory (the control sockets of its
        servers), as on a machine of its own."""
        run = os.path.join(self.work, "run-" + host)
        os.makedirs(run, exist_ok=True)
        return dict(self.env, PARALLAX_HOST_ID=host, PARALLAX_RUN_DIR=run)

    def plx(self, host, *args, check=True, timeout=600):
        env = self.host_env(host)
        r = subprocess.run([self.a.parallax, "-b", self.a.url] + list(args), env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        if check and r.returncode:
            raise RuntimeError("parallax %s (as %s) exited %d: %s" % (
                " ".join(args), host, r.returncode, r.stderr.decode().strip()))
        return r

    def free_port(self):
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        return port

    def start_lockd(self, name):
        """Lock manager NAME (one per --lockds; with two or more each is started with --store, and
        the LUN's reservation keys decide which one is active, the others standing by)."""
        if name not in self.lockd_port:
            self.lockd_port[name] = self.free_port()
        logf = open(os.path.join(self.work, "lockd-%s.log" % name), "a")
        argv = [self.a.lockd, "--listen", "127.0.0.1:%d" % self.lockd_port[name], "--lease", str(self.a.lease)]
        if self.a.lockds > 1:
            argv += ["--store", self.a.url, "--id", name]
        self.lockd[name] = subprocess.Popen(argv, stdout=logf, stderr=logf)
        time.sleep(0.3)
        if self.lockd[name].poll() is not None:
            raise RuntimeError("parallax-lockd %s did not start" % name)

    def lockd_list(self):
        return ",".join("127.0.0.1:%d" % self.lockd_port[n] for n in sorted(self.lockd_port))

    def active_lockd(self):
        """The running lock manager whose log last said it became active (not since a standby)."""
        for n in sorted(self.lockd):
            if self.lockd[n].poll() is not None:
                continue
            last = None
            with open(os.path.join(self.work, "lockd-%s.log" % n), errors="replace") as f:
                for line in f:
                    if "active: engines may connect" in line:
                        last = "active"
                    elif "now a standby" in line:
                        last = "standby"
            if last == "active" or self.a.lockds == 1:
                return n
        raise RuntimeError("no lock manager is active")

    def sock(self, host):
        return os.path.join(self.work, host + ".sock")

    def start_host(self, host):
        path = self.sock(host)
        if os.path.exists(path):
            os.unlink(path)
        logf = open(os.path.join(self.work, host + ".log"), "a")
        env = self.host_env(host)
        self.hosts[host] = subprocess.Popen([self.a.parallax, "-b", self.a.url, "serve", "--unix", path],
                                            env=env, stdout=logf, stderr=logf)
        for _ in range(300):
            if os.path.exists(path):
                return
            if self.hosts[host].poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError("host %s did not start: see %s.log" % (host, host))

    def kill(self, p):
        if p and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()

    def stop_hosts(self):
        for p in self.hosts.values():
            if p.poll() is None:
                p.terminate()
        for p in self.hosts.values():
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill(p)

    def stop_lockd(self):
        for p in self.lockd.values():
            if p.poll() is None:
                p.terminate()
                p.wait()

    # ---- the store's figures ------------------------------------------------------------------
    def used_blocks(self):
        j = json.loads(self.plx("admin", "info", "--json").stdout)
        return sum(j["blocks_used"].values()), j["extent_size"] // BLOCK


def connect(pool, host, vdi, deadline_s):
    """An NBD connection to VDI on host, retried until the VDI may be opened there (its previous
    holder has closed it, or has died and its lease has run out)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            return NBD(pool.sock(host), vdi)
        except (OSError, RuntimeError, EOFError) as e:
            if time.monotonic() > end:
                raise RuntimeError("could not open %s on %s within %d s: %s" % (vdi, host, deadline_s, e))
            time.sleep(0.2)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--parallax", required=True)
    p.add_argument("--lockd", required=True)
    p.add_argument("--out", required=True, help="results file (text); FILE.dat gets the samples")
    p.add_argument("--hosts", type=int, default=3)
    p.add_argument("--vdis", type=int, default=30)
    p.add_argument("--vdi-size", type=int, default=32, help="MiB")
    p.add_argument("--days", type=int, default=30)
    p.add_argument("--hours", type=int, default=8, help="snapshots per VDI per day")
    p.add_argument("--keep", type=int, default=6, help="snapshots kept per VDI")
    p.add_argument("--writes", type=int, default=4, help="writes per VDI per hour")
    p.add_argument("--migrate", type=int, default=2, help="VDIs migrating per day")
    p.add_argument("--crash-day", type=int, default=10)
    p.add_argument("--lockd-day", type=int, default=20)
    p.add_argument("--lease", type=int, default=10)
    p.add_argument("--lockds", type=int, default=2, help="lock managers (2+: fail-over on the LUN)")
    p.add_argument("--lock-timeout", type=int, default=30)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    rng = random.Random(a.seed)
    size = a.vdi_size << 20
    pool = Pool(a)
    out = open(a.out, "w")

    def say(*x):
        line = " ".join(str(v) for v in x)
        log(line)
        out.write(line + "\n")
        out.flush()

    hosts = ["h%d" % (i + 1) for i in range(a.hosts)]
    lockds = ["lk%d" % (i + 1) for i in range(a.lockds)]
    for n in lockds:
        pool.start_lockd(n)
    pool.plx("admin", "lockd-set", pool.lockd_list())
    for h in hosts:
        pool.start_host(h)

    # The golden image: random data, snapshotted once; every VDI is a clone of it.
    pool.plx("admin", "vdi-create", "gold", "--size", "%dM" % a.vdi_size)
    gold = bytearray(os.urandom(size))
    c = connect(pool, hosts[0], "gold", 30)
    for off in range(0, size, 1 << 20):
        c.write(off, bytes(gold[off:off + (1 << 20)]))
    c.flush()
    c.close()
    time.sleep(0.5)
    pool.plx(hosts[0], "vdi-snapshot", "gold", "--label", "pristine")
    vdis = ["vm%02d" % (i + 1) for i in range(a.vdis)]
    model, where, conn, snaps = {}, {}, {}, {}
    snap_model = {}  # the first VDI's kept snapshots: number -> bytes
    for i, v in enumerate(vdis):
        pool.plx("admin", "vdi-create", v, "--from", "gold@pristine")
        model[v] = bytearray(gold)
        where[v] = hosts[i % len(hosts)]
        conn[v] = connect(pool, where[v], v, 60)
        snaps[v] = []
    del gold
    used0, extent_blocks = pool.used_blocks()
    say("pool: %d hosts, %d VDIs of %d MiB cloned from one golden snapshot, %d days x %d hours, "
        "%d snapshots kept per VDI, %d writes per VDI per hour, extents of %d MiB" % (
            a.hosts, a.vdis, a.vdi_size, a.days, a.hours, a.keep, a.writes, extent_blocks * BLOCK >> 20))
    dat = open(a.out + ".dat", "w")
    dat.write("# hour day used_mib reachable_mib bound_mib freed_blocks\n")
    misses, gcs, worst, refused = 0, 0, 0.0, 0
    down = None          # (host, day it died)
    lockd_down_hour, lockd_down = None, None
    t0 = time.monotonic()
    hour = 0
    for day in range(1, a.days + 1):
        for h in range(a.hours):
            hour += 1
            # Writes and a flush on every VDI through its host: the model follows once flushed.
            for v in vdis:
                c = conn[v]
                pending = []
                for _ in range(a.writes):
                    n = rng.choice((1, 2, 4, 8, 16))
                    off = rng.randrange(0, size // BLOCK - n + 1) * BLOCK
                    data = os.urandom(n * BLOCK)
                    c.write(off, data)
                    pending.append((off, data))
                c.flush()
                for off, data in pending:
                    model[v][off:off + len(data)] = data
            # A snapshot of every VDI; the oldest beyond --keep deleted. While the lock manager
            # is down (and no standby took over) a command may be refused: counted, not fatal.
            for v in vdis:
                r = pool.plx(where[v], "vdi-snapshot", v, check=lockd_down_hour is None)
                if r.returncode:
                    refused += 1
                    continue
                num = int(r.stdout.decode().strip().rsplit("@", 1)[1])
                snaps[v].append(num)
                if v == vdis[0]:
                    snap_model[num] = bytes(model[v])
                while len(snaps[v]) > a.keep:
                    r = pool.plx(where[v], "snap-delete", "%s@%d" % (v, snaps[v][0]),
                                 check=lockd_down_hour is None)
                    if r.returncode:
                        refused += 1
                        break
                    old = snaps[v].pop(0)
                    if v == vdis[0]:
                        del snap_model[old]
            if lockd_down_hour is not None and hour >= lockd_down_hour + 1:
                pool.start_lockd(lockd_down)
                say("day %d hour %d: lock manager %s restarted%s" % (
                    day, h, lockd_down, " (operator)" if a.lockds == 1 else " (as a standby)"))
                lockd_down_hour = None
            used, _ = pool.used_blocks()
            dat.write("%d %.3f %.2f - - -\n" % (hour, hour / a.hours, used * BLOCK / 2**20))
        # Once a day: gc from a host that serves nothing, while every host serves.
        j = json.loads(pool.plx("gc-host", "gc", "--json", "--quiet").stdout)
        gcs += 1
        used, _ = pool.used_blocks()
        freed = j["freed"]["metadata"] + j["freed"]["data"]
        reach = j["reachable"]
        bound = 1.2 * reach + len(hosts) * extent_blocks
        ratio = used / reach if reach else 0
        worst = max(worst, ratio)
        if used > bound:
            misses += 1
        dat.write("%d %.3f %.2f %.2f %.2f %d\n" % (hour, hour / a.hours, used * BLOCK / 2**20,
                                                reach * BLOCK / 2**20, bound * BLOCK / 2**20, freed))
        dat.flush()
        say("day %d: gc freed %d blocks (%d extents released, %d skipped); used %d blocks = %.2fx "
            "the %d reachable (bound %d)%s" % (day, freed, j["extents_released"], j["extents_skipped"],
                                              used, ratio, reach, bound, "" if used <= bound else "  MISSED"))
        # Migrations: a few VDIs move to another live host.
        live = [x for x in hosts if not down or x != down[0]]
        for v in rng.sample(vdis, min(a.migrate, len(vdis))):
            dst = rng.choice([x for x in live if x != where[v]])
            conn[v].close()
            conn[v] = connect(pool, dst, v, 4 * a.lease + 30)
            where[v] = dst
        # The host crash, and its return the next day.
        if down and day == down[1] + 1:
            pool.start_host(down[0])
            say("day %d: host %s back" % (day, down[0]))
            down = None
        if day == a.crash_day and len(hosts) > 1:
            victim = hosts[1]
            pool.kill(pool.hosts[victim])
            t = time.monotonic()
            moved = [v for v in vdis if where[v] == victim]
            survivors = [x for x in hosts if x != victim]
            for k, v in enumerate(moved):
                try:
                    conn[v].close()
                except OSError:
                    pass
                where[v] = survivors[k % len(survivors)]
                conn[v] = connect(pool, where[v], v, 4 * a.lease + 60)
            say("day %d: host %s killed -9; its %d VDIs open on the survivors %.1f s later (lease %d s)" % (
                day, victim, len(moved), time.monotonic() - t, a.lease))
            down = (victim, day)
        if day == a.lockd_day:
            lockd_down = pool.active_lockd()
            pool.kill(pool.lockd[lockd_down])
            lockd_down_hour = hour
            say("day %d: lock manager %s (the active one) killed -9" % (day, lockd_down))
    # Every flushed byte, read back.
    bad = 0
    for v in vdis:
        for off in range(0, size, 1 << 20):
            if conn[v].read(off, 1 << 20) != bytes(model[v][off:off + (1 << 20)]):
                bad += 1
        conn[v].close()
    sbad = 0
    for num, m in sorted(snap_model.items()):
        c = connect(pool, where[vdis[0]], "%s@%d" % (vdis[0], num), 60)
        for off in range(0, size, 1 << 20):
            if c.read(off, 1 << 20) != m[off:off + (1 << 20)]:
                sbad += 1
        c.close()
    say("verify: %d VDIs x %d MiB read back, %d MiB differed from the flushed model; %d kept snapshots "
        "of %s, %d MiB differed" % (len(vdis), a.vdi_size, bad, len(snap_model), vdis[0], sbad))
    pool.stop_hosts()
    r = pool.plx("admin", "check", "--quiet", check=False)
    pool.stop_lockd()
    say("check: %s" % ("clean" if r.returncode == 0 else "exit %d: %s" % (r.returncode, r.stderr.decode().strip())))
    say("summary: %d gcs, used/reachable at gc at most %.2fx, bound missed %d times; %d snapshot "
        "commands refused while the lock manager was down; %.0f s" % (
            gcs, worst, misses, refused, time.monotonic() - t0))
    ok = bad == 0 and sbad == 0 and r.returncode == 0
    say("result: data %s, space %s" % ("verified" if ok else "FAILED", "met" if misses == 0 else "MISSED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

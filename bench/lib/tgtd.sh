# Sourced by the benchmarks that need a real iSCSI target (bench/iscsi.sh, bench/cluster.sh,
# bench/wcache.sh, bench/wcache-ab.sh).
#
#   tgtd_start LOG   start tgtd in the foreground of a background job on a free loopback port and
#                    a random control port; sets tgtd_pid, port and ctl. A control port someone else
#                    holds makes tgtd exit at once, so it tries five times; exits the script with
#                    the log's last lines when none started.
# The caller's EXIT trap stops tgtd by tgtd_pid.

tgtd_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

tgtd_start() {
    local log=$1 try i
    tgtd_pid=""
    for try in 1 2 3 4 5; do
        port=$(tgtd_free_port)
        ctl=$((20000 + RANDOM % 12000))
        tgtd -f -C "$ctl" --iscsi portal="127.0.0.1:$port" >"$log" 2>&1 &
        tgtd_pid=$!
        for ((i = 0; i < 50; i++)); do
            tgtadm -C "$ctl" --op show --mode sys >/dev/null 2>&1 && break
            sleep 0.1
        done
        kill -0 "$tgtd_pid" 2>/dev/null && return 0
        tgtd_pid=""
    done
    echo "tgtd did not start (5 tries): $(tail -3 "$log")" >&2
    exit 1
}

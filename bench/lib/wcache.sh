# shellcheck shell=bash
# shellcheck disable=SC2034,SC2154 # (globals shared with bench/lib/tgtd.sh and the caller)
# Sourced by the write-cache benchmarks (bench/wcache.sh, bench/wcache-tapdisk.sh): fio's JSON,
# the statistics of paired rounds, and the slow shared store (a tgtd LUN whose tgtd is throttled
# with cgroup v1 blkio to a given write speed). Needs bench/lib/tgtd.sh sourced first.
#
#   fio_json ARGS...          fio --output-format=json, only the JSON (the nbd engine says hello
#                             first), killed after FIO_TIMEOUT seconds (default 900)
#   load                      the load averages (1, 5, 15 min)
#   mean V...                 their mean, rounded
#   ratio A B                 A / B to two decimals
#   paired NUM DEN            two arrays (by name) of per-round values: "RATIO_OF_MEANS MEDIAN MIN
#                             MAX" of NUM over DEN: the ratio of their means, and the median, min
#                             and max of the per-round ratios NUM[i] / DEN[i]
#   pstat LABEL NUM DEN [TARGET]   one printed line of paired's four numbers
#   slow_store_start WORK CGROUP BYTES_PER_S STORE_MIB IQN
#                             a LUN file WORK/lun.img of STORE_MIB, served by tgtd (O_DIRECT) in
#                             the new cgroup CGROUP, whose writes to the disk holding WORK are
#                             limited to BYTES_PER_S; sets majmin (that disk), url (the LUN's
#                             iscsi:// URL), tgtd_pid, port and ctl. The caller's EXIT trap kills
#                             tgtd_pid and removes CGROUP.
#   store_cpu_idle            tgtd's threads at SCHED_IDLE (threads it starts later inherit it):
#                             the target then runs only on CPU time that nothing else wants, as if
#                             the shared store were another machine (an iSCSI array's CPU is not
#                             the host's); on this 2-core VM tgtd otherwise spends about as much
#                             CPU per 4 KiB WRITE as serve (bench/notes/wcache.md, "QD1 mean with the
#                             drain beside the writer").

# (killed after FIO_TIMEOUT seconds, default 900: fio stuck on an NBD server ignores SIGTERM)
fio_json() { timeout -s KILL "${FIO_TIMEOUT:-900}" fio --output-format=json "$@" 2>/dev/null | sed -n '/^{/,$p'; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
mean() { printf '%s\n' "$@" | awk '{ s += $1 } END { printf "%.0f", s / NR }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; } # (rounded, as paired's)
paired() {
    local -n pn=$1 pd=$2
    local i
    for ((i = 0; i < ${#pn[@]}; i++)); do echo "${pn[i]} ${pd[i]}"; done |
        awk '{ sn += $1; sd += $2; r[NR] = $1 / $2 }
             END { for (i = 2; i <= NR; i++) { v = r[i]; for (j = i - 1; j >= 1 && r[j] > v; j--) r[j + 1] = r[j]; r[j + 1] = v }
                   m = NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2
                   printf "%.2f %.2f %.2f %.2f", sn / sd, m, r[1], r[NR] }'
}
pstat() {
    local a b c d
    local -n pnum=$2
    read -r a b c d <<<"$(paired "$2" "$3")"
    printf '  %s: ratio of the means %s, median of the %d per-round ratios %s (min %s, max %s)%s\n' \
        "$1" "$a" "${#pnum[@]}" "$b" "$c" "$d" "${4:+ (target $4)}"
}

slow_store_start() {
    local work=$1 cg=$2 slow=$3 store_mib=$4 iqn=$5
    majmin=$(lsblk -dno MAJ:MIN "$(findmnt -no SOURCE -T "$work" | sed 's/[0-9]*$//;s/p$//')" | tr -d ' ')
    mkdir "$cg"
    echo "$majmin $slow" >"$cg/blkio.throttle.write_bps_device"
    truncate -s "${store_mib}M" "$work/lun.img"
    tgtd_start "$work/tgtd.log"
    echo "$tgtd_pid" >"$cg/cgroup.procs"
    tgtadm -C "$ctl" --lld iscsi --op new --mode target --tid 1 -T "$iqn"
    # O_DIRECT in tgtd: buffered writes would reach the disk from the kernel's flusher, outside
    # the throttled group.
    tgtadm -C "$ctl" --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 -b "$work/lun.img" \
        --bsoflags direct
    tgtadm -C "$ctl" --lld iscsi --op bind --mode target --tid 1 -I ALL
    url=iscsi://127.0.0.1:$port/$iqn/1
}

store_cpu_idle() {
    local t
    for t in /proc/"$tgtd_pid"/task/*; do chrt -i -p 0 "${t##*/}" >/dev/null; done
}

#!/usr/bin/env bash
# A compressed month of a pool's life (bench/README.md, "Pool soak"; issue 30): tgtd on loopback
# with one LUN on a sparse file under --dir, parallax-lockd, several `parallax serve` hosts, VDIs
# cloned from a golden image, writes all the time, a snapshot per VDI every "hour" with only the
# newest kept, gc every "day" from another host while every host serves, migrations, one host
# killed -9 and the active one of two lock managers killed -9 (bench/soak.py drives it and says what it measures).
# Results: bench/results/soak-HOST-STAMP.txt (not committed) and bench/plots/soak.png (used space
# over time against what the live VDIs and kept snapshots reach).
#
#   bench/soak.sh [--dir DIR] [--quick] [--plot FILE] [-- SOAK.PY OPTIONS...]
#   --quick: 3 days of 6 hours, 6 VDIs of 8 MiB (a smoke run: it judges the data, not the space)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/lib/tgtd.sh"
cd "$root"
dir=/var/tmp plot=bench/plots/soak.png extra=() quick=
while [[ $# -gt 0 ]]; do
    case $1 in
    --dir) dir=$2; shift 2 ;;
    --plot) plot=$2; shift 2 ;;
    --quick) quick=1; extra+=(--days 3 --hours 6 --vdis 6 --vdi-size 8 --lockd-day 1 --crash-day 2); shift ;;
    --) shift; extra+=("$@"); break ;;
    *) echo "usage: $0 [--dir DIR] [--quick] [--plot FILE] [-- SOAK.PY OPTIONS...]" >&2; exit 2 ;;
    esac
done
[[ $(id -u) -eq 0 ]] || { echo "bench/soak.sh: tgtd needs root" >&2; exit 1; }
make -s all

work=$(mktemp -d "$dir/plx-bench-soak.XXXXXX")
tgtd_pid=""
cleanup() {
    # soak.py stops its own servers; whatever is left of them is killed here by its socket dir.
    pkill -9 -f -- "$work/" 2>/dev/null || true
    if [[ -n $tgtd_pid ]]; then
        kill -9 "$tgtd_pid" 2>/dev/null || true
        wait "$tgtd_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' INT TERM

truncate -s 6G "$work/lun.img"
tgtd_start "$work/tgtd.log"
iqn=iqn.2026-11.org.parallax.bench:soak
adm() { tgtadm -C "$ctl" --lld iscsi "$@"; }
adm --op new --mode target --tid 1 -T "$iqn"
adm --op new --mode logicalunit --tid 1 --lun 1 -b "$work/lun.img"
adm --op bind --mode target --tid 1 -I ALL
url=iscsi://127.0.0.1:$port/$iqn/1
PARALLAX_HOST_ID=admin build/parallax -b "$url" format --extent-size 16M >/dev/null

mkdir -p bench/results "$(dirname "$plot")"
base=bench/results/soak-$(hostname -s 2>/dev/null || echo host)-$(date -u +%Y%m%dT%H%M%SZ)
[[ -n $quick ]] && base=$work/soak-quick
echo "source: $(git rev-parse --short HEAD 2>/dev/null || echo unknown); load $(cut -d' ' -f1-3 /proc/loadavg)"
rc=0
python3 bench/soak.py --url "$url" --work "$work" --parallax "$root/build/parallax" \
    --lockd "$root/build/parallax-lockd" --out "$base.txt" "${extra[@]}" || rc=$?
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$base.txt"
if [[ -z $quick ]]; then
    gnuplot <<GP
set terminal pngcairo size 900,420 font "DejaVu Sans,10"
set output "$plot"
set title "Pool soak: used space over a compressed month (bench/soak.sh; $(git rev-parse --short HEAD 2>/dev/null))" noenhanced
set xlabel "day"
set ylabel "MiB"
set grid ytics
set key top left
set datafile missing "-"
plot "$base.txt.dat" using 2:3 with lines lw 2 title "used (parallax info)", \
     "" using 2:4 with points pt 7 title "reachable at gc (gc's count)", \
     "" using 2:5 with linespoints dt 2 pt 1 title "target: 1.2 x reachable + one extent per host"
GP
    echo "plot: $plot; results: $base.txt"
fi
exit $rc

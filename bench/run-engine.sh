#!/usr/bin/env bash
# Build build/bench-engine and run it, saving the results under bench/results/:
#   bench/results/engine-HOST-YYYYmmddTHHMMSSZ.json   the numbers (--json)
#   bench/results/engine-HOST-YYYYmmddTHHMMSSZ.txt    the printed table
#
#   bench/run-engine.sh                    full run (defaults: 4 GiB VDI, 5 s per run, /var/tmp)
#   bench/run-engine.sh --quick            smoke run
#   bench/run-engine.sh --dir /mnt/ssd     any bench-engine option is passed through
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

make bench-engine

mkdir -p bench/results
host=$(hostname -s 2>/dev/null || echo host)
base=bench/results/engine-$host-$(date -u +%Y%m%dT%H%M%SZ)
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if ! git diff --quiet HEAD -- libparallax 2>/dev/null; then rev="$rev+dirty"; fi
echo "source:   libparallax at $rev" > "$base.txt"
build/bench-engine --json "$base.json" "$@" | tee -a "$base.txt"
echo "saved: $base.json $base.txt" >&2

# bench/suite/plot.gp - the suite's figures, from the .dat files `suite.py assemble` writes.
#   gnuplot -e "datadir='DIR/plotdata'; outdir='bench/plots'" bench/suite/plot.gp
# A figure whose data file is missing (section not run) is skipped.

if (!exists("datadir")) datadir = "plotdata"
if (!exists("outdir")) outdir = "."

exists_file(f) = system("test -s '" . f . "' && echo 1 || echo 0") + 0

set terminal pngcairo size 1400,1000 enhanced font "DejaVu Sans,12" linewidth 1.5
set grid ytics lc rgb "#dddddd"
set key top right box opaque
set style line 1 lc rgb "#1f77b4" pt 7 ps 1.3 lw 2.5
set style line 2 lc rgb "#d62728" pt 5 ps 1.3 lw 2.5
set style line 3 lc rgb "#7f7f7f" pt 9 ps 1.3 lw 2 dt 2
set style line 4 lc rgb "#2ca02c" pt 11 ps 1.3 lw 2

# ---- 1. throughput against snapshot depth -----------------------------------------------------
if (exists_file(datadir . "/depth-4k-randread.dat")) {
    set output outdir . "/suite-depth.png"
    set multiplot layout 2,2 title "Throughput against live-snapshot depth (fio nbd engine over a unix socket)" font ",15"
    set logscale x
    set xlabel "snapshot depth (live snapshots taken)"
    set xrange [0.7:1500]
    set logscale y
    set format y "%.0s%c"
    set key bottom left box opaque
    set title "4 KiB random read, QD 32"
    set ylabel "IOPS (log)"
    plot datadir . "/depth-4k-randread.dat" u 1:2 w lp ls 1 t "Parallax", \
         "" u 1:3 w lp ls 2 t "qcow2", \
         "" u 1:4 w lp ls 3 t "direct (raw, no snapshots)"
    set title "4 KiB random write, QD 32"
    plot datadir . "/depth-4k-randwrite.dat" u 1:2 w lp ls 1 t "Parallax", \
         "" u 1:3 w lp ls 2 t "qcow2", \
         "" u 1:4 w lp ls 3 t "direct (raw, no snapshots)"
    set title "1 MiB sequential read, QD 8"
    set ylabel "MiB/s (log)"
    plot datadir . "/depth-1M-read.dat" u 1:2 w lp ls 1 t "Parallax", \
         "" u 1:3 w lp ls 2 t "qcow2", \
         "" u 1:4 w lp ls 3 t "direct (raw, no snapshots)"
    set title "1 MiB sequential write, QD 8"
    plot datadir . "/depth-1M-write.dat" u 1:2 w lp ls 1 t "Parallax", \
         "" u 1:3 w lp ls 2 t "qcow2", \
         "" u 1:4 w lp ls 3 t "direct (raw, no snapshots)"
    unset multiplot
    unset logscale
    set format y "%g"
    unset xrange
    set key top right box opaque
}

# ---- 2. snapshot latency histograms (figure 5.7) ------------------------------------------------
if (exists_file(datadir . "/lat-idle.dat")) {
    set output outdir . "/suite-snapshot-latency.png"
    set multiplot layout 2,1 title "Live snapshot latency, back to back (log-spaced bins, 8 per decade)" font ",15"
    set logscale x
    set xrange [0.1:200]
    set xlabel "latency (ms, log)"
    set ylabel "snapshots"
    set style fill transparent solid 0.35 border
    set key top right
    set arrow 1 from 1, graph 0 to 1, graph 1 nohead lc rgb "#2ca02c" dt 3 lw 2
    set arrow 2 from 3.25, graph 0 to 3.25, graph 1 nohead lc rgb "#2ca02c" dt 2 lw 2
    set label 1 "thesis: p50 < 1 ms" at 1, graph 0.95 right offset -0.5,0 tc rgb "#2ca02c"
    set label 2 "max 3.25 ms" at 3.25, graph 0.88 left offset 0.5,0 tc rgb "#2ca02c"
    set title "idle disk"
    plot datadir . "/lat-idle.dat" u 3:4:1:2:(0):4 w boxxy ls 1 t "Parallax (server: control socket round trip)", \
         "" u 3:5:1:2:(0):5 w boxxy ls 4 t "Parallax (parallax vdi-snapshot, end to end)", \
         "" u 3:6:1:2:(0):6 w boxxy ls 2 t "qcow2 (QMP blockdev-snapshot-sync)"
    if (exists_file(datadir . "/lat-busy.dat")) {
        set title "busy disk (fio 4 KiB random writes, QD 32)"
        plot datadir . "/lat-busy.dat" u 3:4:1:2:(0):4 w boxxy ls 1 t "Parallax (server: control socket round trip)", \
             "" u 3:5:1:2:(0):5 w boxxy ls 4 t "Parallax (parallax vdi-snapshot, end to end)", \
             "" u 3:6:1:2:(0):6 w boxxy ls 2 t "qcow2 (QMP blockdev-snapshot-sync)"
    }
    unset multiplot
    unset logscale
    unset xrange
    unset arrow
    unset label
    set style fill empty
}

# ---- 3. snapshot frequency (figures 5.8, 5.9) -----------------------------------------------------
if (exists_file(datadir . "/freq-seqwrite.dat") || exists_file(datadir . "/freq-build.dat")) {
    set output outdir . "/suite-frequency.png"
    set multiplot layout 2,2 title "Snapshot frequency: throughput relative to no snapshots (figure 5.8) and Parallax metadata per snapshot (figure 5.9)" font ",14"
    set style data histograms
    set style histogram clustered gap 1
    set style fill solid 0.8 border -1
    set boxwidth 0.9
    set xlabel "snapshot interval asked"
    set key top right
    do for [wl in "build seqwrite"] {
        f = datadir . "/freq-" . wl . ".dat"
        if (exists_file(f)) {
            set title (wl eq "build" ? "unpack and build a source tree on ext4 (no-snapshot time / time)" : "sequential 1 MiB writes at full speed (MiB/s relative)")
            set ylabel "relative to no snapshots"
            set yrange [0:1.5]
            plot f u 3:xtic(1) lc rgb "#1f77b4" t "Parallax", "" u 4 lc rgb "#d62728" t "qcow2", \
                 1 w l lc rgb "#000000" dt 2 notitle, 0.96 w l lc rgb "#2ca02c" dt 3 t "target 0.96"
        }
    }
    if (exists_file(datadir . "/freq-meta.dat")) {
        set title "Parallax metadata per snapshot (reachable metadata after - before, / snapshots)"
        set ylabel "KiB per snapshot (log)"
        set logscale y
        set yrange [0.1:*]
        # only the workloads that ran (run.sh --freq, or no build without root): a column of
        # NaN only is an error in a histogram
        m = datadir . "/freq-meta.dat"
        cmd = ""
        if (exists_file(datadir . "/freq-build.dat")) { cmd = cmd . sprintf("'%s' u 2:xtic(1) lc rgb '#1f77b4' t 'unpack + build', ", m) }
        if (exists_file(datadir . "/freq-seqwrite.dat")) { cmd = cmd . sprintf("'%s' u 3:xtic(1) lc rgb '#9467bd' t 'seq write', ", m) }
        if (exists_file(datadir . "/freq-trickle.dat")) { cmd = cmd . sprintf("'%s' u 4:xtic(1) lc rgb '#2ca02c' t 'trickle 600 KiB/s', ", m) }
        eval "plot " . cmd . "5.84 w l lc rgb '#000000' dt 3 t 'thesis 5.84 KB'"
        unset logscale y
    }
    if (exists_file(datadir . "/freq-build.dat")) {
        set title "unpack + build: interval achieved (wall time / snapshots)"
        set ylabel "ms"
        set yrange [0:*]
        set logscale y
        set yrange [1:*]
        plot datadir . "/freq-build.dat" every ::1 u 6:xtic(1) lc rgb "#1f77b4" t "Parallax", "" every ::1 u 7 lc rgb "#d62728" t "qcow2"
        unset logscale y
    }
    unset multiplot
    unset yrange
    set style data points
}

# ---- 4. Bonnie++ / PostMark, relative to direct (figures 5.1-5.4) --------------------------------
if (exists_file(datadir . "/fs.dat")) {
    set output outdir . "/suite-fs.png"
    set title "ext4 over NBD (nbdfuse + loop): Parallax and qcow2 relative to direct (1.0 = direct, higher is better)" font ",14"
    set style data histograms
    set style histogram clustered gap 1
    set style fill solid 0.85 border -1
    set boxwidth 0.9
    set xtics rotate by -20
    set xlabel ""
    set ylabel "relative to direct, same run"
    set yrange [0:*]
    set key top right
    plot datadir . "/fs.dat" u 2:xtic(1) lc rgb "#aec7e8" t "Parallax cold", "" u 3 lc rgb "#ff9896" t "qcow2 cold", \
         "" u 4 lc rgb "#1f77b4" t "Parallax warm", "" u 5 lc rgb "#d62728" t "qcow2 warm", \
         1 w l lc rgb "#000000" dt 2 notitle
    unset xtics
    set xtics
    unset yrange
}

# ---- 5. random placement (figure 5.5) -------------------------------------------------------------
if (exists_file(datadir . "/place.dat")) {
    set output outdir . "/suite-placement.png"
    set terminal pngcairo size 1000,700 enhanced font "DejaVu Sans,12"
    set title "Reads of a disk written in random order, relative to one written sequentially" font ",14"
    set style data histograms
    set style histogram clustered gap 1
    set style fill solid 0.85 border -1
    set xlabel ""
    set ylabel "random-order / sequential-order"
    set yrange [0:*]
    plot datadir . "/place.dat" u 2:xtic(1) lc rgb "#1f77b4" t "1 MiB sequential read", \
         "" u 3 lc rgb "#ff7f0e" t "4 KiB random read QD 32", 1 w l lc rgb "#000000" dt 2 notitle
}

# bench/scale.gp - costs against the snapshot count (and the VDI count), from bench-scale's CSV.
#   gnuplot -e "csv='scale.csv'; out='bench/plots/scale-snapshots.png'" bench/scale.gp
set datafile separator ","
set terminal pngcairo size 1400,1000 noenhanced font "DejaVu Sans,12" linewidth 1.5
set output out
set grid ytics lc rgb "#dddddd"
set key top left box opaque
set logscale x
set xlabel "snapshots of the VDI (log)"
set multiplot layout 2,2 title "Costs against the number of snapshots of one VDI (file blockstore, O_DIRECT)" font ",15"
set logscale y
set ylabel "ms (log)"
set title "VDI@N and VDI@LABEL lookup against reading the whole log (the old lookup)"
plot csv u 1:3 every ::1 w lp lw 2.5 pt 7 t "VDI@1 (oldest)", \
     "" u 1:4 every ::1 w lp lw 2.5 pt 5 t "VDI@newest", \
     "" u 1:10 every ::1 w lp lw 2.5 pt 11 t "VDI@LABEL (oldest label)", \
     "" u 1:12 every ::1 w lp lw 2.5 pt 13 t "VDI@LABEL (missing label)", \
     "" u 1:5 every ::1 w lp lw 2 dt 2 pt 9 t "whole log read (before skip links / label index)"
set title "Opening: a snapshot export (VDI@1, read-only) and the writer"
plot csv u 1:6 every ::1 w lp lw 2.5 pt 7 t "open VDI@1 + close", \
     "" u 1:7 every ::1 w lp lw 2.5 pt 5 t "open for writing + close (2 flushes)"
set title "Snapshot latency (blocking, one at a time)"
plot csv u 1:2 every ::1 w lp lw 2.5 pt 7 t "snapshot (every 10th labelled)", \
     "" u 1:13 every ::1 w lp lw 2.5 pt 5 t "labelled snapshot right after a writable open", \
     "" u 1:5 every ::1 w lp lw 2 dt 2 pt 9 t "whole log read (its label check before the index)"
unset logscale y
set ylabel "IOPS"
set yrange [0:*]
set title "4 KiB random read, 32 in flight (in process, O_DIRECT)"
plot csv u 1:8 every ::1 w lp lw 2.5 pt 7 t "newest snapshot", \
     "" u 1:9 every ::1 w lp lw 2 dt 2 pt 5 t "VDI@1, measured right after (same moment's baseline)"
unset multiplot

# The collector: bench-scale --gc at several sizes (gc.csv: nodes_per_vdi, metadata_read,
# mark_seconds, mark_nodes_per_s, check_seconds, fio_qd32_iops, fio_qd1_iops, check_qd1_seconds,
# check_nodes_per_s, check_qd1_nodes_per_s).
if (exists("gccsv")) {
    set output gcout
    set multiplot layout 1,2 title "Collector mark phase and check against metadata size (scattered nodes)" font ",15"
    unset logscale y
    set logscale x
    set xlabel "live radix nodes (log)"
    set yrange [0:*]
    set ylabel "nodes read per second"
    set key bottom right box opaque
    set title "gc mark phase against fio 4 KiB random read on the same disk"
    plot gccsv u 2:4 every ::1 w lp lw 2.5 pt 7 t "gc mark (32 reads in flight)", \
         "" u 2:9 every ::1 w lp lw 2.5 pt 11 t "check (32 reads in flight)", \
         "" u 2:10 every ::1 w lp lw 2 dt 4 pt 13 t "check, one read at a time (before)", \
         "" u 2:6 every ::1 w lp lw 2 dt 2 pt 5 t "fio randread QD32", \
         "" u 2:7 every ::1 w lp lw 2 dt 3 pt 9 t "fio randread QD1"
    set logscale y
    set yrange [*:*]
    set ylabel "seconds (log)"
    set key top left box opaque
    set title "time"
    plot gccsv u 2:3 every ::1 w lp lw 2.5 pt 7 t "gc mark", \
         "" u 2:5 every ::1 w lp lw 2.5 pt 5 t "check", \
         "" u 2:8 every ::1 w lp lw 2 dt 4 pt 13 t "check, one read at a time (before)"
    unset multiplot
}

# A server's memory (serve-memory.csv: vdis, rss_kib, kib_per_vdi_since_first).
if (exists("memcsv")) {
    set output memout
    set multiplot layout 1,1 title "parallax serve: resident memory against VDIs served (one NBD connection each)" font ",15"
    set logscale x
    unset logscale y
    set yrange [0:*]
    set xlabel "VDIs served (log)"
    set ylabel "VmRSS, MiB"
    set key top left box opaque
    set title "default node cache budget: 64 MiB"
    plot memcsv u 1:($2/1024) every ::2 w lp lw 2.5 pt 7 t "server RSS"
    unset multiplot
}

# The registry: bench-scale --vdis (vdis.csv: vdis, create_ms, lookup_first_ms, lookup_last_ms,
# open_rw_ms, page_ms, list_ms).
if (exists("vdicsv")) {
    set output vdiout
    set multiplot layout 1,2 title "Costs against the number of VDIs in the store (file blockstore, O_DIRECT)" font ",15"
    set logscale x
    set logscale y
    set yrange [*:*]
    set xlabel "VDIs (log)"
    set ylabel "ms (log)"
    set key top left box opaque
    set title "lookup by name and a page against reading every record (version 1's lookup)"
    plot vdicsv u 1:3 every ::1 w lp lw 2.5 pt 7 t "lookup, oldest VDI", \
         "" u 1:4 every ::1 w lp lw 2.5 pt 5 t "lookup, newest VDI", \
         "" u 1:6 every ::1 w lp lw 2.5 pt 9 t "a page of 100 (vdi-list --limit 100)", \
         "" u 1:7 every ::1 w lp lw 2 dt 2 pt 11 t "every record (plx_vdi_list)"
    set title "create (3 flushes) and open for writing (2 flushes)"
    plot vdicsv u 1:2 every ::1 w lp lw 2.5 pt 7 t "create", \
         "" u 1:5 every ::1 w lp lw 2.5 pt 5 t "open for writing + close"
    unset multiplot
}

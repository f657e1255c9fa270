# bench/scale.gp - costs against the snapshot count, from bench-scale's CSV.
#   gnuplot -e "csv='scale.csv'; out='bench/plots/scale-snapshots.png'" bench/scale.gp
set datafile separator ","
set terminal pngcairo size 1400,1000 enhanced font "DejaVu Sans,12" linewidth 1.5
set output out
set grid ytics lc rgb "#dddddd"
set key top left box opaque
set logscale x
set xlabel "snapshots of the VDI (log)"
set multiplot layout 2,2 title "Costs against the number of snapshots of one VDI (file blockstore, O_DIRECT)" font ",15"
set logscale y
set ylabel "ms (log)"
set title "VDI@N lookup against reading the whole log (the old lookup)"
plot csv u 1:3 every ::1 w lp lw 2.5 pt 7 t "VDI@1 (oldest)", \
     "" u 1:4 every ::1 w lp lw 2.5 pt 5 t "VDI@newest", \
     "" u 1:5 every ::1 w lp lw 2 dt 2 pt 9 t "whole log read (before skip links)"
set title "Opening: a snapshot export (VDI@1, read-only) and the writer"
plot csv u 1:6 every ::1 w lp lw 2.5 pt 7 t "open VDI@1 + close", \
     "" u 1:7 every ::1 w lp lw 2.5 pt 5 t "open for writing + close (2 flushes)"
set title "Snapshot latency (blocking, one at a time)"
plot csv u 1:2 every ::1 w lp lw 2.5 pt 7 t "snapshot"
unset logscale y
set ylabel "IOPS"
set yrange [0:*]
set title "4 KiB random read of the newest snapshot, 32 in flight"
plot csv u 1:8 every ::1 w lp lw 2.5 pt 7 t "IOPS"
unset multiplot

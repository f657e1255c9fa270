# bench/wcache.gp - the figure of bench/wcache.sh (thesis figures 5.10/5.11): how long a write
# burst takes, and what it leaves to drain, and the latency of 4 KiB writes at QD 1, for the
# local disk (fio on a file, and the same disk over NBD through nbdkit), parallax serve over a
# file on it, and the write cache off, on and automatic in front of a slow shared store.
#   gnuplot -e "dataf='wcache.dat'; outf='wcache.png'; ttl='...'" bench/wcache.gp

set terminal pngcairo size 1400,650 enhanced font "DejaVu Sans,12" linewidth 1.5
set output outf
set grid ytics lc rgb "#dddddd"
set bmargin 6
set style fill solid 0.85 border -1
set boxwidth 0.6
set xrange [-0.6:5.6]
set xtics rotate by -20
set multiplot layout 1,2 title "Write cache: ".ttl font ",15"

set title "Burst: written (solid) and drained to the store afterwards (light)"
set ylabel "seconds"
set yrange [0:*]
set offsets 0, 0, graph 0.12, 0
set key top left
plot dataf u 1:($3+$4):xtic(2) w boxes lc rgb "#aec7e8" t "drain after the burst", \
     "" u 1:3 w boxes lc rgb "#1f77b4" t "burst (fio, fsync at the end)", \
     "" u 1:3:(sprintf("%.2f s", $3)) w labels offset 0,1 notitle

set title "4 KiB writes at queue depth 1"
set ylabel "microseconds"
set key top left
plot dataf u ($1-0.15):5:(0.3):xtic(2) w boxes lc rgb "#ff7f0e" t "mean", \
     "" u ($1+0.15):6:(0.3) w boxes lc rgb "#2ca02c" t "median", \
     "" u ($1+0.15):6:(sprintf("%.0f", $6)) w labels offset 0,1 notitle

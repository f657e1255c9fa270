# bench/clones.gp - the figure of bench/clones.sh: space used by N booted clones, and boot time.
#   gnuplot -e "spacef='space.dat'; bootf='boot-median.dat'; outf='clones.png'" bench/clones.gp

set terminal pngcairo size 1400,650 enhanced font "DejaVu Sans,12" linewidth 1.5
set output outf
set grid ytics lc rgb "#dddddd"
set bmargin 5
set multiplot layout 1,2 title "Clones of one golden image (Debian cloud kernel, ext4 root), QEMU TCG" font ",15"

# Raw copies grow N times faster than the rest: drawn off scale, their largest value in the key.
stats spacef u 4 nooutput
rawmax = STATS_max / 1048576
stats spacef u 3 nooutput
ymax = 1.6 * STATS_max / 1048576

set title "Space used after N clones booted and wrote their file"
set xlabel "clones booted"
set ylabel "MiB"
set yrange [0:ymax]
set key bottom right box opaque
plot spacef u 1:($4/1048576) w lp lc rgb "#7f7f7f" pt 9 ps 1.3 lw 2 dt 2 \
         t sprintf("raw copies (off scale: %.0f MiB at the last point)", rawmax), \
     "" u 1:($3/1048576) w lp lc rgb "#d62728" pt 5 ps 1.3 lw 2.5 t "qcow2 overlays + backing file", \
     "" u 1:($2/1048576) w lp lc rgb "#1f77b4" pt 7 ps 1.3 lw 2.5 t "Parallax store (used blocks)", \
     "" u 1:(($2-$7)/1048576) w lp lc rgb "#1f77b4" pt 6 ps 1.3 lw 1.5 dt 2 t "Parallax, less blocks claimed ahead", \
     "" u 1:($5/1048576) w l lc rgb "#2ca02c" lw 2 dt 3 t "one image + what the guests wrote"

set title "Boot to the first line of user space on the root disk (median)"
set xlabel ""
set ylabel "seconds"
set yrange [0:*]
set offsets 0, 0, graph 0.12, 0
set style fill solid 0.8
set boxwidth 0.6
set key off
set xtics ("Parallax clone (NBD)" 0, "qcow2 clone" 1, "raw copy" 2)
set xrange [-0.6:2.6]
plot bootf u 1:3:($1==0 ? 0x1f77b4 : ($1==1 ? 0xd62728 : 0x7f7f7f)) w boxes lc rgb variable, \
     "" u 1:3:(sprintf("%.2f s", $3)) w labels offset 0,1

unset multiplot

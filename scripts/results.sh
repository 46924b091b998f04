#!/usr/bin/env bash
# Runs every benchmark and scenario comparison the README and docs/results.md report, one
# after the other (each starts its own daemon), and keeps their tables in OUT (default
# target/results). Run on a quiet machine: `make build && scripts/results.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-target/results}
V=./target/release/virtsoc
mkdir -p "$OUT"
run() { # name, args...
    local name=$1
    shift
    echo "== $name: virtsoc $*" | tee "$OUT/$name.txt"
    "$V" "$@" 2>/dev/null | tee -a "$OUT/$name.txt"
}
run svm bench svm --ordering atomic,fence --frames 200
run svm-gpu bench svm --ordering atomic,fence --frames 150 --consumer gpu
run svm-gpu-readers2 bench svm --ordering fence --frames 150 --consumer gpu --readers 2 --protocol prefetch
run svm-gpu-switch30 bench svm --ordering fence --frames 150 --consumer gpu --switch-every 30 --protocol prefetch
run devices bench devices --resolution 1080p,uhd --frames 60
run uhd-video run uhd-video --compare --seconds 4 --save "$OUT/uhd-video.json"
run uhd-video-gpu run uhd-video --compare --seconds 4 --composition gpu --save "$OUT/uhd-video-gpu.json"
for s in uhd-video video-360 camera ar livestream; do
    run "$s-1080p" run "$s" --resolution 1080p --fps 30 --compare --seconds 4 --save "$OUT/$s-1080p.json"
done
run transport bench transport
echo "tables in $OUT"

#!/usr/bin/env bash
# Builds the C tests and the example C decoder (examples/c-decoder) against the static guest
# library and runs them against a fresh daemon. The decoder decodes H.264 clips the ffmpeg CLI
# makes here (B-frames, a resolution change) and its framemd5 lines must equal
# `ffmpeg -f framemd5 -pix_fmt yuv420p`'s, frame by frame, bit-exact.
# Usage: tests/c/run.sh [debug|release]
set -euo pipefail
profile=${1:-debug}
root=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}/$profile
build=$root/tests/c/build
mkdir -p "$build"
# The device stubs are generated from the device declarations, never committed.
"$target/virtsoc" devices --c-header > "$build/virtsoc_devices.h"
programs=()
for src in "$root"/tests/c/test_*.c; do
  name=$(basename "$src" .c)
  cc -std=c11 -Wall -Wextra -Werror -O1 -I"$root/crates/guest/include" -I"$build" \
      "$src" "$target/libvirtsoc_guest.a" -lpthread -ldl -lm -o "$build/$name"
  programs+=("$build/$name")
done
# shellcheck disable=SC2046 # pkg-config prints several words
cc -std=c11 -Wall -Wextra -Werror -O1 -I"$root/crates/guest/include" -I"$build" \
    $(pkg-config --cflags libavutil) "$root/examples/c-decoder/decode.c" \
    "$target/libvirtsoc_guest.a" $(pkg-config --libs libavutil) -lpthread -ldl -lm \
    -o "$build/decode"
# Clips: 4:2:0 (a 4:4:4 stream would compare FFmpeg's and the daemon's chroma scalers, not
# the decode); no B-frames with a GOP of 10 as a newcomer's first clip, x264's default
# B-frames (reordered output), and a 320x240 stream followed by a 176x144 one.
clip() { # name size frames [x264 options...]
  local name=$1 size=$2 frames=$3
  shift 3
  ffmpeg -hide_banner -loglevel error -y -f lavfi -i "testsrc=size=$size:rate=25" \
      -frames:v "$frames" -c:v libx264 -pix_fmt yuv420p "$@" "$build/$name.h264"
}
clip plain 320x240 30 -bf 0 -g 10
clip bframes 320x240 30
clip small 176x144 12 -bf 0 -g 10
cat "$build/plain.h264" "$build/small.h264" > "$build/change.h264"
sock=$(mktemp -u /tmp/virtsoc-ctest-XXXXXX.sock)
coproc DAEMON { exec "$target/virtsocd" --socket "$sock" --print-ready 2>"$build/virtsocd.log"; }
read -r ready <&"${DAEMON[0]}"
case "$ready" in READY*) ;; *) echo "virtsocd did not start"; cat "$build/virtsocd.log"; exit 1;; esac
status=0
for p in "${programs[@]}"; do
  "$p" "$sock" || status=$?
done
for name in plain bframes change; do
  want=$build/$name.ffmpeg.framemd5 got=$build/$name.virtsoc.framemd5
  # -autoscale 0: frames keep their size after a resolution change, as the decoder's do.
  ffmpeg -hide_banner -loglevel error -i "$build/$name.h264" -autoscale 0 -pix_fmt yuv420p \
      -f framemd5 - | grep -v '^#' > "$want"
  if ! "$build/decode" "$sock" "$build/$name.h264" 2>"$build/$name.decode.log" \
      | grep -v '^#' > "$got"; then
    echo "FAIL c-decoder: $name: the decoder failed"; cat "$build/$name.decode.log"; status=1
  elif [ ! -s "$want" ] || ! diff -u "$want" "$got"; then
    echo "FAIL c-decoder: $name: frames differ from ffmpeg -f framemd5 ($want, $got)"; status=1
  elif [ "$name" = change ] && ! grep -q "resolution change 1: 176x144 from frame 30" \
      "$build/$name.decode.log"; then
    echo "FAIL c-decoder: stream_info did not report the change to 176x144 at frame 30"
    cat "$build/$name.decode.log"; status=1
  else
    echo "ok   c-decoder: $name.h264: $(wc -l < "$got") frames bit-exact against ffmpeg -f framemd5"
  fi
done
kill -TERM "$DAEMON_PID"
wait "$DAEMON_PID" || { echo "virtsocd exited with an error"; status=1; }
exit $status

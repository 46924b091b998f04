#!/usr/bin/env bash
# Builds the C test against the static guest library and runs it against a fresh daemon.
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
sock=$(mktemp -u /tmp/virtsoc-ctest-XXXXXX.sock)
coproc DAEMON { exec "$target/virtsocd" --socket "$sock" --print-ready 2>"$build/virtsocd.log"; }
read -r ready <&"${DAEMON[0]}"
case "$ready" in READY*) ;; *) echo "virtsocd did not start"; cat "$build/virtsocd.log"; exit 1;; esac
status=0
for p in "${programs[@]}"; do
  "$p" "$sock" || status=$?
done
kill -TERM "$DAEMON_PID"
wait "$DAEMON_PID" || { echo "virtsocd exited with an error"; status=1; }
exit $status

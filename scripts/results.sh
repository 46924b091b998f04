#!/usr/bin/env bash
# Regenerates every figure the README quotes (and the benchmarks docs/results.md reports) into
# ONE output directory, with the commit, the date and the machine's load recorded beside them:
#
#   scripts/results.sh [OUT]          # default OUT: target/results/<UTC date>-<short commit>
#   QUICK=1 scripts/results.sh OUT    # shorter runs (a smoke test of the script, not figures)
#   SKIP_DOCS=1 scripts/results.sh    # only what the README quotes (no sharing/migrate/isolation)
#
# OUT/meta.txt: commit (and whether the work tree had changes), date, kernel, cores, CPU model,
# the load (`uptime`) at the start and the end. Each OUT/<name>.txt: the command, `uptime`
# before and after, then its output (stderr in OUT/<name>.err); JSON beside it where the
# command writes one. OUT/README-figures.txt says which file holds which README figure.
# Builds the release binaries first. Run it on a quiet machine: every figure is load-sensitive.
set -euo pipefail
cd "$(dirname "$0")/.."
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
OUT=${1:-target/results/$(date -u +%Y%m%dT%H%M%SZ)-$commit}
V=./target/release/virtsoc
QUICK=${QUICK:-0}
mkdir -p "$OUT"
cargo build --release --workspace >"$OUT/build.log" 2>&1 || {
    echo "release build failed: $OUT/build.log" >&2
    exit 1
}

{
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
        echo "work tree: modified (tracked files differ from the commit)"
    else
        echo "work tree: clean"
    fi
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "kernel: $(uname -sr)"
    echo "cores: $(nproc)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
    echo "load at start: $(uptime)"
} >"$OUT/meta.txt"
cat "$OUT/meta.txt"

# secs N: N seconds, or 2 with QUICK=1.
secs() { if [ "$QUICK" = 1 ]; then echo 2; else echo "$1"; fi; }
# frames N: N frames, or 30 with QUICK=1.
frames() { if [ "$QUICK" = 1 ]; then echo 30; else echo "$1"; fi; }

run() { # name, virtsoc args...
    local name=$1
    shift
    {
        echo "== $name: virtsoc $*"
        echo "commit $commit, started $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "load before: $(uptime)"
    } | tee "$OUT/$name.txt"
    local rc=0
    "$V" "$@" 2>"$OUT/$name.err" | tee -a "$OUT/$name.txt" || rc=$?
    echo "load after: $(uptime)" | tee -a "$OUT/$name.txt"
    if [ "$rc" != 0 ]; then
        echo "FAILED (exit $rc): see $OUT/$name.err" | tee -a "$OUT/$name.txt"
    fi
}

# The scenario comparisons run interleaved rounds, each mode with a fresh daemon, where the
# binary has `run --rounds`; otherwise the same --compare several times (the README's ranges
# "in four runs").
if "$V" run --help 2>/dev/null | grep -q -- '--rounds'; then
    ROUNDS=(--rounds "$([ "$QUICK" = 1 ] && echo 1 || echo 5)")
    REPEAT=1
else
    ROUNDS=()
    REPEAT=$([ "$QUICK" = 1 ] && echo 1 || echo 4)
fi

# --- What the README quotes -----------------------------------------------------------------
# UHD video at 60 fps: fps, copies per frame, decode-to-photon p50 per mode, and its spread.
for r in $(seq 1 "$REPEAT"); do
    run "uhd-video-$r" run uhd-video --compare --seconds "$(secs 4)" "${ROUNDS[@]}" \
        --save "$OUT/uhd-video-$r.json"
done
# Camera and ar at 1080p30 (motion-to-photon, copies per frame, the daemon's CPU), and every
# other scenario at 1080p30 (the frame rates, livestream's latency).
for s in uhd-video video-360 camera ar livestream; do
    run "$s-1080p" run "$s" --resolution 1080p --fps 30 --compare --seconds "$(secs 4)" \
        "${ROUNDS[@]}" --save "$OUT/$s-1080p.json"
done
# The realistic and the cheap UHD clip side by side (stop 36's README line), the GLES video at
# 1080p60 with its per-stage breakdown, and the services with a VM guest.
for c in realistic cheap; do
    run "uhd-video-$c" run uhd-video --compare --seconds "$(secs 3)" --clip "$c" "${ROUNDS[@]}" \
        --save "$OUT/uhd-video-$c.json"
done
run gles-video-1080p run gles-video --compare --resolution 1080p --fps 60 --seconds "$(secs 4)" \
    "${ROUNDS[@]}" --save "$OUT/gles-video-1080p.json"
run gles-video-breakdown run gles-video --compare --breakdown --resolution 1080p --fps 60 \
    --seconds "$(secs 4)"
if [ -d target/vm-image ]; then
    run services bench services --json --vm-image target/vm-image
else
    run services bench services --json
fi
# GPU composition on lavapipe: ms per UHD and 1080p frame against the device's fastest pass.
run devices bench devices --resolution 1080p,uhd --frames "$(frames 60)"
# The same composition inside the UHD scenario (`--composition gpu`).
run uhd-video-gpu run uhd-video --compare --seconds "$(secs 4)" --composition gpu \
    --save "$OUT/uhd-video-gpu.json"
# SVM microbenchmark: access latency, copies, prediction; with the GPU reading each frame,
# with two readers and with a new ring every 30 frames.
run svm bench svm --ordering atomic,fence --frames "$(frames 200)"
run svm-gpu bench svm --ordering atomic,fence --frames "$(frames 150)" --consumer gpu
run svm-gpu-readers2 bench svm --ordering fence --frames "$(frames 150)" --consumer gpu \
    --readers 2 --protocol prefetch
run svm-gpu-switch30 bench svm --ordering fence --frames "$(frames 150)" --consumer gpu \
    --switch-every 30 --protocol prefetch

# --- What docs/results.md reports beyond the README ------------------------------------------
if [ "${SKIP_DOCS:-0}" != 1 ]; then
    run transport bench transport
    if [ "$QUICK" = 1 ]; then
        run sharing bench sharing --seconds 2 --repeats 1 --guests 2 --hogs 1 \
            --json --chart "$OUT/sharing.svg"
    else
        run sharing bench sharing --json --chart "$OUT/sharing.svg"
    fi
    run migrate bench migrate --json
    run isolation bench isolation --json
fi

cat >"$OUT/README-figures.txt" <<EOF
README figure -> file in this directory
UHD video 60 fps: prefetch+fence fps and copies/frame, guest-staging+atomic fps and copies,
  decode-to-photon p50 per mode, its spread between runs -> uhd-video-*.txt (.json)
Camera 1080p30: copies/frame, motion-to-photon p50 (and the ratio), daemon CPU % -> camera-1080p.txt
ar 1080p30: motion-to-photon p50 -> ar-1080p.txt
1080p scenarios hold 30 fps; livestream fps and latency -> {uhd-video,video-360,camera,ar,livestream}-1080p.txt
GPU composition ms per UHD / 1080p frame, the device's fastest pass (floor ms), their ratio -> devices.txt
  (and inside the scenario: uhd-video-gpu.txt)
SVM microbenchmark: access latency, copies per frame, prediction -> svm.txt
  GPU reader (coherence vs one upload, access latency, accuracy) -> svm-gpu.txt,
  two readers -> svm-gpu-readers2.txt, new ring every 30 frames -> svm-gpu-switch30.txt
EOF
echo "load at end: $(uptime)" >>"$OUT/meta.txt"
echo "figures in $OUT (meta.txt: commit, date, load)"

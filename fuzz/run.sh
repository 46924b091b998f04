#!/usr/bin/env bash
# Builds the libFuzzer targets and runs each one for a bounded time, printing the execution
# counts libFuzzer reports. Usage: fuzz/run.sh [TARGET...] (default: every target).
#
#   FUZZ_SECONDS    seconds per target (default 60)
#   FUZZ_RUNS       stop a target earlier, after this many executions (default: no limit)
#   FUZZ_SANITIZER  cargo fuzz --sanitizer (default address with a nightly toolchain: ASan
#                   checks the unsafe code, the shared-memory and mmap accesses, that safe
#                   Rust cannot; none without nightly, where only the stable compiler
#                   unlocked for cargo fuzz's flags is there and it cannot build ASan)
#
# cargo fuzz needs nightly rustc flags: with a nightly toolchain installed it is used
# (`cargo +nightly`), otherwise the stable compiler is unlocked with RUSTC_BOOTSTRAP=1
# (only with FUZZ_SANITIZER=none). Found inputs go to fuzz/work/<target> (not committed; the
# seeds are in fuzz/corpus/<target>), crashes to fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$HOME/.cargo/bin:$PATH"
SECONDS_PER=${FUZZ_SECONDS:-60}
SAN=${FUZZ_SANITIZER:-address}
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(handshake ring_entry device_commands at_parser tcp_frame worker_answer gles_stream service_packet service_reassembly service_records)

command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    CARGO=(cargo +nightly)
else
    export RUSTC_BOOTSTRAP=1
    CARGO=(cargo)
    SAN=none
fi
FLAGS=(-s "$SAN" -a)
"${CARGO[@]}" fuzz build "${FLAGS[@]}"

summary=()
for t in "${TARGETS[@]}"; do
    mkdir -p "work/$t" "artifacts/$t" "corpus/$t"  # a target without seeds starts from nothing
    log="artifacts/$t.log"
    # gles_stream loads the host's GL driver (Mesa), which keeps strings it strdup'd at
    # initialisation for the life of the process; LeakSanitizer cannot tell them from a leak
    # (the allocating frame is in an unnamed module) and fails the run on them. Every other
    # target keeps leak detection.
    asan=${ASAN_OPTIONS:-}
    [ "$t" != gles_stream ] || asan=detect_leaks=0${asan:+:$asan}
    # Leaks inside third-party libraries the targets reach (see lsan.supp).
    lsan=suppressions=$PWD/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}
    # gles_stream runs 256 inputs on one context (see its notes): what they made together
    # peaked near 2 GB; one allocation is still held to 2 GB.
    rss=2048
    [ "$t" != gles_stream ] || rss=8192
    # device_commands' devices keep what inputs opened (decoders, encoders, fences) across
    # inputs, as a daemon does for a guest: libFuzzer would scan the whole heap for leaks
    # after every input that allocates more than it frees (92% of the run's time, 50-80
    # inputs a second). LeakSanitizer still checks once when the run ends.
    extra=()
    [ "$t" != device_commands ] || extra=(-detect_leaks=0)
    # A guest may legally draw hundreds of millions of vertices, which llvmpipe takes over
    # 30 s for (the daemon ends such a render worker at its batch deadline): gles_stream runs
    # in a child process that libFuzzer restarts past such an input instead of stopping.
    [ "$t" != gles_stream ] || extra=(-fork=1 -ignore_timeouts=1)
    echo "== $t: ${SECONDS_PER} s"
    set +e
    ASAN_OPTIONS=$asan LSAN_OPTIONS=$lsan "${CARGO[@]}" fuzz run "${FLAGS[@]}" "$t" "work/$t" "corpus/$t" -- \
        -max_total_time="$SECONDS_PER" ${FUZZ_RUNS:+-runs="$FUZZ_RUNS"} -print_final_stats=1 -timeout=30 \
        -rss_limit_mb="$rss" -malloc_limit_mb=2048 "${extra[@]}" \
        -artifact_prefix="artifacts/$t/" >"$log" 2>&1
    rc=$?
    set -e
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
    execs=$(grep -E 'stat::number_of_executed_units' "$log" | tail -1 | awk '{print $2}' || true)
    rate=$(grep -E 'stat::average_exec_per_sec' "$log" | tail -1 | awk '{print $2}' || true)
    echo "$done_line"
    echo "stat::number_of_executed_units: ${execs:-?}  exec/s: ${rate:-?}  exit: $rc"
    summary+=("$(printf '%-16s %12s execs %8s exec/s  exit %s' "$t" "${execs:-?}" "${rate:-?}" "$rc")")
    if [ $rc -ne 0 ]; then
        echo "   $t FAILED: see fuzz/$log and fuzz/artifacts/$t/"
        tail -30 "$log"
    fi
done
echo
printf '%s\n' "${summary[@]}"

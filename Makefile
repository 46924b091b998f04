# virtsoc: the two set-up commands are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

.PHONY: deps build demo test lint check ctest clean fuzz soak

deps:
	scripts/install-deps.sh

build: deps
	$(CARGO) build --release --workspace

## The main job: a guest pipeline against the daemon, coherence protocols side by side:
## the transport and SVM microbenchmarks, then the uhd-video scenario for every protocol and
## ordering mode, with charts written to target/demo/report; then a camera scenario keeps
## running with the live view on (its URL is printed) until Ctrl-C.
VIEW_LISTEN ?= 127.0.0.1:8080
demo: build
	./target/release/virtsoc demo
	@mkdir -p target/demo
	./target/release/virtsoc run uhd-video --compare --seconds 4 --save target/demo/uhd-video.json
	./target/release/virtsoc report target/demo/uhd-video.json --out target/demo/report
	./target/release/virtsoc watch camera --listen $(VIEW_LISTEN)

## Builds everything and runs every test: lint, unit, integration (real daemon and guest
## processes), and the C ABI test.
## One feature set for the build and the tests (the window and V4L2 backends included), so
## nothing is compiled twice; no incremental state (a fresh checkout gains nothing from it).
TEST_FEATURES := --features virtsoc/window,virtsoc/v4l2,virtsocd/window,virtsocd/v4l2
## The integration tests of crates/cli take the daemon the workspace build made (without it,
## each test binary would run `cargo build -p virtsocd` first: see crates/cli/tests/common.rs).
test: export VIRTSOCD = $(CURDIR)/target/debug/virtsocd
test: export VIRTSOC_REQUIRE_ALL = 1
test: export CARGO_INCREMENTAL = 0
test: deps lint
	$(CARGO) build --workspace $(TEST_FEATURES)
	$(CARGO) test --workspace $(TEST_FEATURES)
	./target/debug/virtsoc gles validate --scenes all
	tests/c/run.sh debug

## Quick checks that need no root and no system packages beyond the build's: formatting,
## clippy and the unit tests of every crate (no daemon, no VM).
check:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps
	$(CARGO) test --workspace --lib --bins

## The fuzz targets are their own workspace (cargo fuzz builds them with nightly flags):
## `check` keeps them compiling against the crates they exercise.
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p virtsoc -p virtsocd --all-targets --features virtsoc/window,virtsoc/v4l2,virtsocd/window,virtsocd/v4l2 -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps
	$(CARGO) check --manifest-path fuzz/Cargo.toml --bins --target-dir target/fuzz-check

ctest:
	$(CARGO) build -p virtsoc-guest -p virtsoc -p virtsocd
	tests/c/run.sh debug

## libFuzzer targets (fuzz/fuzz_targets), each for FUZZ_SECONDS (default 60) seconds; prints
## libFuzzer's execution counts. cargo fuzz wants nightly: fuzz/run.sh uses `cargo +nightly`
## with AddressSanitizer when a nightly toolchain is installed, else RUSTC_BOOTSTRAP=1 with
## `--sanitizer none`.
## One target: `fuzz/run.sh ring_entry`.
FUZZ_SECONDS ?= 60
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) fuzz/run.sh

## The soak of issue 10 (release build): SOAK_GUESTS guests for SOAK_SECONDS seconds.
SOAK_GUESTS ?= 32
SOAK_SECONDS ?= 600
soak:
	$(CARGO) build --release -p virtsoc -p virtsocd
	./target/release/virtsoc soak --guests $(SOAK_GUESTS) --seconds $(SOAK_SECONDS)

clean:
	$(CARGO) clean
	rm -rf tests/c/build

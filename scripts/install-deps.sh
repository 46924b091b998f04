#!/usr/bin/env bash
# Installs what virtsoc needs on Debian 12 (run as root, or with sudo available).
# Idempotent: packages already present are not reinstalled, and apt is not touched at all
# when nothing is missing.
set -euo pipefail

packages=(
  build-essential   # cc and make for the C ABI test
  pkg-config
  ca-certificates
  curl
  clang libclang-dev                      # bindgen for ffmpeg-sys-next
  libavcodec-dev libavformat-dev libavutil-dev libswscale-dev
  libavdevice-dev libavfilter-dev libswresample-dev
  ffmpeg                                  # test clips and golden frame hashes
  mesa-vulkan-drivers libvulkan1          # wgpu on lavapipe (CPU Vulkan) where there is no GPU
  qemu-system-x86 busybox-static xz-utils # VM guests (TCG) and their image
  x11-xkb-utils xkb-data                  # the GLES guest image's own Xvfb (xkbcomp, keymaps)
  fonts-dejavu-core                       # chart labels in `virtsoc report`
  nginx-light libnginx-mod-rtmp           # the livestream scenario's local RTMP server
  xvfb x11-apps                           # the display's window backend, tested under Xvfb
  chromium                                # the live view, tested in a headless browser
  khronos-api                             # gl.xml: the GLES encoder/decoder are generated from it
  libglvnd-dev libegl-dev libgles-dev     # glvnd's vendor ABI (libeglabi.h), EGL/GLES headers
  libegl-mesa0 libgl1-mesa-dri libgles2   # the host renderer: Mesa's EGL/GLES (llvmpipe here)
  glmark2-es2-x11 mesa-utils-bin          # unmodified GLES programs: glmark2-es2, es2gears, es2_info
  virgl-server                            # virgl_test_server: the virgl comparison in bench gles
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Rust (stable, edition 2021). Debian's own rustc is too old; use rustup when cargo is absent.
if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
  echo "install-deps: installing the Rust toolchain with rustup"
  curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component rustfmt,clippy
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: cargo is in $HOME/.cargo/bin; add it to PATH (the Makefile does)"
fi
echo "install-deps: ok"

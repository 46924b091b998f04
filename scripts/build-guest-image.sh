#!/usr/bin/env bash
# Builds the VM guest image for `virtsoc vm run`: a Debian kernel (the package is downloaded
# and extracted, never installed on the host) and a busybox initramfs holding the guest-side
# `virtsoc` binary with the shared libraries it needs.
#
# Usage: scripts/build-guest-image.sh OUT_DIR VIRTSOC_BINARY
# The kernel is cached in OUT_DIR and reused; the initramfs is rebuilt when the binary changed.
set -euo pipefail
out=${1:?usage: build-guest-image.sh OUT_DIR VIRTSOC_BINARY}
bin=${2:?usage: build-guest-image.sh OUT_DIR VIRTSOC_BINARY}
mkdir -p "$out"
out=$(cd "$out" && pwd)
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
[ -x "$bin" ] || { echo "build-guest-image: $bin is not an executable" >&2; exit 1; }
command -v busybox >/dev/null || { echo "build-guest-image: busybox-static is missing (scripts/install-deps.sh)" >&2; exit 1; }

modules="virtio virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_console"
work=$(mktemp -d)
chmod 777 "$work"   # apt-get download writes as the _apt user
trap 'rm -rf "$work"' EXIT

if [ ! -f "$out/vmlinuz" ] || [ ! -d "$out/modules" ]; then
  pkg=$(apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' | sort -V | tail -1 | cut -d' ' -f1)
  if [ -z "$pkg" ]; then
    apt-get update -q >/dev/null
    pkg=$(apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' | sort -V | tail -1 | cut -d' ' -f1)
  fi
  [ -n "$pkg" ] || { echo "build-guest-image: no Debian 6.1 kernel package found" >&2; exit 1; }
  echo "build-guest-image: extracting $pkg"
  (cd "$work" && apt-get download "$pkg" >/dev/null)
  dpkg-deb -x "$work"/*.deb "$work/k"
  kver=$(ls "$work/k/lib/modules" | head -1)
  rm -rf "$out/modules" && mkdir -p "$out/modules"
  for m in $modules; do
    f=$(find "$work/k/lib/modules/$kver" -name "$m.ko*" | head -1)
    [ -n "$f" ] || continue   # built in
    case "$f" in
      *.xz) xz -dc "$f" > "$out/modules/$m.ko" ;;
      *.zst) zstd -qdc "$f" > "$out/modules/$m.ko" ;;
      *) cp "$f" "$out/modules/$m.ko" ;;
    esac
  done
  cp "$work"/k/boot/vmlinuz-* "$out/vmlinuz.tmp" && mv "$out/vmlinuz.tmp" "$out/vmlinuz"
fi

stamp=$(sha256sum "$bin" | cut -d' ' -f1)
if [ -f "$out/initramfs.cpio.gz" ] && [ "$(cat "$out/initramfs.stamp" 2>/dev/null)" = "$stamp" ]; then
  exit 0
fi
root="$work/root"
mkdir -p "$root"/{bin,dev,proc,sys,tmp,lib/modules}
cp "$(command -v busybox)" "$root/bin/busybox"
# Debug symbols only slow the boot down.
strip -o "$root/bin/virtsoc" "$bin" 2>/dev/null || cp "$bin" "$root/bin/virtsoc"
cp "$out"/modules/*.ko "$root/lib/modules/" 2>/dev/null || true
# The binary's shared libraries, at the paths the dynamic loader expects.
for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
cat > "$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t devtmpfs dev /dev
mount -t proc proc /proc
mount -t sysfs sys /sys
# Load the virtio modules; a module whose dependencies are not in yet is retried next pass.
left="virtio virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_console"
for pass in 1 2 3 4 5 6; do
  again=""
  for m in $left; do
    [ -f /lib/modules/$m.ko ] || continue
    insmod /lib/modules/$m.ko 2>/tmp/insmod.err || { grep -q "File exists" /tmp/insmod.err || again="$again $m"; }
  done
  left=$again
  [ -z "$left" ] && break
done
[ -n "$left" ] && echo "virtsoc guest: could not load:$left" && cat /tmp/insmod.err
# Wait (bounded) for the virtio-serial port to appear.
i=0
while [ $i -lt 50 ] && ! grep -qs . /sys/class/virtio-ports/*/name; do sleep 0.1; i=$((i+1)); done
args=$(tr ' ' '\n' < /proc/cmdline | sed -n 's/^virtsoc.args=//p')
echo "VIRTSOC-GUEST-BEGIN"
VIRTSOC_ARGS_HEX=$args /bin/virtsoc
echo "VIRTSOC-GUEST-EXIT $?"
poweroff -f
INIT
chmod +x "$root/init"
(cd "$root" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) > "$out/initramfs.cpio.gz.tmp"
mv "$out/initramfs.cpio.gz.tmp" "$out/initramfs.cpio.gz"
echo "$stamp" > "$out/initramfs.stamp"
echo "build-guest-image: $out (kernel + initramfs with $(basename "$bin"))"

#!/usr/bin/env bash
# Builds a VM guest image for `virtsoc vm run`: a Debian kernel (the package is downloaded
# and extracted, never installed on the host) and a busybox initramfs.
#
# Usage: scripts/build-guest-image.sh OUT_DIR VIRTSOC_BINARY
#          The core image: the guest-side `virtsoc` binary with its shared libraries; the
#          guest runs `virtsoc ARGS...` (the arguments of `virtsoc vm run`).
#        scripts/build-guest-image.sh --gles OUT_DIR VENDOR_LIBRARY
#          The GLES image: unmodified Debian programs (glmark2-es2 with its data in
#          /usr/share/glmark2, es2_info, es2gears_x11), glvnd (libEGL.so.1, libGLESv2.so.2),
#          virtsoc's vendor library VENDOR_LIBRARY (libEGL_virtsoc.so, installed as glvnd's
#          only EGL vendor) and an Xvfb of the guest's own with xkbcomp and the XKB data, all
#          copied from the host's installed packages with every shared library they need
#          (ldd). No virtsoc binary: the guest's init starts Xvfb and runs ARGS as a command
#          line (`virtsoc vm run --image OUT_DIR -- glmark2-es2 --validate`).
# The kernel is cached in OUT_DIR and reused; the initramfs is rebuilt when its inputs (the
# binary or library, this script) changed.
set -euo pipefail
kind=core
if [ "${1:-}" = "--gles" ]; then
  kind=gles
  shift
fi
usage="usage: build-guest-image.sh [--gles] OUT_DIR VIRTSOC_BINARY|VENDOR_LIBRARY"
out=${1:?$usage}
bin=${2:?$usage}
mkdir -p "$out"
out=$(cd "$out" && pwd)
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
[ -f "$bin" ] || { echo "build-guest-image: $bin does not exist" >&2; exit 1; }
[ "$kind" = gles ] || [ -x "$bin" ] || { echo "build-guest-image: $bin is not an executable" >&2; exit 1; }
command -v busybox >/dev/null || { echo "build-guest-image: busybox-static is missing (scripts/install-deps.sh)" >&2; exit 1; }

modules="virtio virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_console"
# Scratch space beside the output (the build's disk), not /tmp: /tmp may be a small tmpfs or
# shared with everything else a CI machine runs.
work=$(mktemp -d "$out/.build.XXXXXX")
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
  # Only the kernel and the modules the guest loads (a few MiB; the whole package unpacks to
  # about 400 MiB).
  mkdir -p "$work/k"
  dpkg-deb --fsys-tarfile "$work"/*.deb | tar -x -C "$work/k" --wildcards \
    './boot/vmlinuz-*' './lib/modules/*/kernel/drivers/virtio/*' './lib/modules/*/kernel/drivers/char/virtio_console.ko*'
  rm -f "$work"/*.deb
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
  rm -f "$out/vmlinux" "$out/vmlinux.none"
fi

# The uncompressed kernel, when it can boot directly (an ELF with the PVH entry note, Xen's
# note 18): QEMU loads it without the bzImage's decompressor, which costs 5-6 s of emulated
# CPU under TCG (`virtsoc vm run` prefers it). Found by the payload's compression magic.
# Whether ELF file `$1` holds all of itself (its section header table, the file's last part,
# ends within it): a decompression cut short (a full disk) leaves a valid-looking head.
elf_whole() {
  local h start size count
  h=$(LC_ALL=C readelf -h "$1" 2>/dev/null) || return 1
  start=$(sed -n 's/.*Start of section headers: *\([0-9]*\).*/\1/p' <<<"$h")
  size=$(sed -n 's/.*Size of section headers: *\([0-9]*\).*/\1/p' <<<"$h")
  count=$(sed -n 's/.*Number of section headers: *\([0-9]*\).*/\1/p' <<<"$h")
  [ -n "$start" ] && [ -n "$size" ] && [ -n "$count" ] &&
    [ "$(stat -c %s "$1")" -ge $((start + size * count)) ]
}
if [ ! -f "$out/vmlinux" ] && [ ! -f "$out/vmlinux.none" ]; then
  touch "$out/vmlinux.none"
  for m in '\xfd7zXZ\x00:xz' '\x28\xb5\x2f\xfd:zstd' '\x1f\x8b\x08:gzip'; do
    pos=$(LC_ALL=C grep -obUaP "${m%%:*}" "$out/vmlinuz" | head -1 | cut -d: -f1) || true
    [ -n "$pos" ] || continue
    # The payload is followed by the bzImage's trailer: the decompressor complains, the
    # output is whole.
    tail -c +$((pos + 1)) "$out/vmlinuz" | "${m##*:}" -dc > "$out/vmlinux.tmp" 2>/dev/null || true
    if readelf -n "$out/vmlinux.tmp" 2>/dev/null | grep -q 'Xen .*(0x00000012)' && elf_whole "$out/vmlinux.tmp"; then
      mv "$out/vmlinux.tmp" "$out/vmlinux" && rm -f "$out/vmlinux.none"
      break
    fi
  done
  rm -f "$out/vmlinux.tmp"
fi

# The GLES image's host programs: their paths, and the Debian package of each.
gles_programs="/usr/bin/glmark2-es2:glmark2-es2-x11 /usr/bin/es2_info.x86_64-linux-gnu:mesa-utils-bin
  /usr/bin/es2gears_x11.x86_64-linux-gnu:mesa-utils-bin /usr/bin/Xvfb:xvfb /usr/bin/xkbcomp:x11-xkb-utils"
# Loaded with dlopen (not in ldd's answer): glvnd's libraries and Xlib (the vendor library's).
gles_dlopened="libEGL.so.1 libGLESv2.so.2 libGLdispatch.so.0 libX11.so.6"
libdir=/usr/lib/x86_64-linux-gnu

stamp=$( (sha256sum "$bin" "$0" | cut -d' ' -f1; echo "$kind") | sha256sum | cut -d' ' -f1)
if [ "$kind" = gles ]; then
  for p in $gles_programs; do
    [ -x "${p%%:*}" ] || { echo "build-guest-image: ${p%%:*} is missing (Debian ${p##*:}; scripts/install-deps.sh)" >&2; exit 1; }
  done
  stamp=$( (echo "$stamp"; dpkg-query -W glmark2-es2-x11 glmark2-data libegl1 libgles2 xvfb mesa-utils-bin) | sha256sum | cut -d' ' -f1)
fi
if [ -f "$out/initramfs.cpio.gz" ] && [ "$(cat "$out/initramfs.stamp" 2>/dev/null)" = "$stamp" ]; then
  exit 0
fi
root="$work/root"
mkdir -p "$root"/{bin,dev,proc,sys,tmp,lib/modules}
cp "$(command -v busybox)" "$root/bin/busybox"
cp "$out"/modules/*.ko "$root/lib/modules/" 2>/dev/null || true

# Copies `$1`'s shared libraries to the paths the dynamic loader expects.
copy_libs() {
  local lib
  for lib in $(ldd "$1" | grep -o '/[^ ]*'); do
    [ -e "$root$lib" ] && continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}

if [ "$kind" = core ]; then
  # Debug symbols only slow the boot down.
  strip -o "$root/bin/virtsoc" "$bin" 2>/dev/null || cp "$bin" "$root/bin/virtsoc"
  copy_libs "$bin"
  run='VIRTSOC_ARGS_HEX=$args /bin/virtsoc'
  setup=''
else
  mkdir -p "$root/usr/bin" "$root/usr/lib/virtsoc" "$root/usr/share/glvnd/egl_vendor.d" \
    "$root/usr/share/X11" "$root/var/lib/xkb" "$root$libdir"
  for p in $gles_programs; do
    p=${p%%:*}
    cp "$p" "$root$p"
    copy_libs "$p"
  done
  for l in $gles_dlopened; do
    cp -L "$libdir/$l" "$root$libdir/$l"
    copy_libs "$libdir/$l"
  done
  strip -o "$root/usr/lib/virtsoc/libEGL_virtsoc.so" "$bin" 2>/dev/null \
    || cp "$bin" "$root/usr/lib/virtsoc/libEGL_virtsoc.so"
  copy_libs "$bin"
  # glvnd's default vendor directory: unmodified programs find virtsoc with no variable set.
  printf '{"file_format_version":"1.0.0","ICD":{"library_path":"/usr/lib/virtsoc/libEGL_virtsoc.so"}}\n' \
    > "$root/usr/share/glvnd/egl_vendor.d/50_virtsoc.json"
  cp -a /usr/share/glmark2 "$root/usr/share/glmark2"
  cp -a /usr/share/X11/xkb "$root/usr/share/X11/xkb"
  # The command line arrives hex-encoded, arguments separated by 0x1f (`virtsoc vm run`).
  run='(set -f; IFS=$(printf "\037"); set -- $(printf "%b" "$(echo "$args" | sed "s/../\\\\x&/g")"); unset IFS; set +f; "$@")'
  # An X server of the guest's own: Xvfb writes its display number to a FIFO once it
  # accepts clients (-displayfd); no GLX (the guest has no Mesa; GLES goes through virtsoc).
  setup='
mkfifo /tmp/xready
Xvfb -displayfd 3 -screen 0 1024x768x24 -nolisten tcp -extension GLX 3>/tmp/xready >/tmp/xvfb.log 2>&1 &
read -t 60 d < /tmp/xready || true
if [ -z "$d" ]; then echo "virtsoc guest: Xvfb did not start:"; cat /tmp/xvfb.log; fi
export DISPLAY=:$d HOME=/tmp'
fi

cat > "$root/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/bin:/bin
mount -t devtmpfs dev /dev
mount -t proc proc /proc
mount -t sysfs sys /sys
# Load the virtio modules; a module whose dependencies are not in yet is retried next pass.
left="$modules"
for pass in 1 2 3 4 5 6; do
  again=""
  for m in \$left; do
    [ -f /lib/modules/\$m.ko ] || continue
    insmod /lib/modules/\$m.ko 2>/tmp/insmod.err || { grep -q "File exists" /tmp/insmod.err || again="\$again \$m"; }
  done
  left=\$again
  [ -z "\$left" ] && break
done
[ -n "\$left" ] && echo "virtsoc guest: could not load:\$left" && cat /tmp/insmod.err
# Wait (bounded) for the virtio-serial port to appear.
i=0
while [ \$i -lt 50 ] && ! grep -qs . /sys/class/virtio-ports/*/name; do sleep 0.1; i=\$((i+1)); done
$setup
args=\$(tr ' ' '\n' < /proc/cmdline | sed -n 's/^virtsoc.args=//p')
echo "VIRTSOC-GUEST-BEGIN"
$run
echo "VIRTSOC-GUEST-EXIT \$?"
poweroff -f
INIT
chmod +x "$root/init"
(cd "$root" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) > "$out/initramfs.cpio.gz.tmp"
mv "$out/initramfs.cpio.gz.tmp" "$out/initramfs.cpio.gz"
echo "$stamp" > "$out/initramfs.stamp"
echo "build-guest-image: $out (kernel + $kind initramfs with $(basename "$bin"))"

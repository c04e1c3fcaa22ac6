#!/bin/bash
# Builds the vm backend's desktop image into an empty directory OUT, offline
# from Debian packages (src/shim/backends/vm/image.ts calls this and caches
# the result under /var/cache/warren/vm):
#   base.img   ext4 root filesystem (Debian bookworm minbase + Xorg, twm,
#              xterm, x11-utils); read-only, the backing file of every vm's
#              qcow2 overlay
#   vmlinuz    Debian's generic kernel (the cloud kernel has no DRM and no
#              framebuffer the VM's display could use)
#   initrd     busybox, the kernel modules the VM needs, warren-agent and /init
#   image.env  what was built (kernel release, sizes)
# Usage: vm-desktop-image.sh OUT AGENT BUSYBOX [MIRROR]
set -euo pipefail
OUT=$1 AGENT=$2 BUSYBOX=$3 MIRROR=${4:-http://deb.debian.org/debian}
SUITE=bookworm
PKGS=xserver-xorg-core,xserver-xorg-input-evdev,xterm,twm,x11-utils,x11-xserver-utils,xfonts-base,e2fsprogs,procps
HERE=$(cd "$(dirname "$0")" && pwd)
R=$OUT/root K=$OUT/kernel I=$OUT/initramfs
mkdir -p "$OUT"

echo "vm-image: debootstrap $SUITE (+ $PKGS)"
if ! debootstrap --variant=minbase --include="$PKGS" "$SUITE" "$R" "$MIRROR" >"$OUT/debootstrap.log" 2>&1; then
  tail -n 20 "$OUT/debootstrap.log" >&2
  exit 1
fi

echo "vm-image: kernel"
KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
[ -n "$KPKG" ] || { echo "vm-image: no linux-image-amd64 in the apt lists (apt-get update)" >&2; exit 1; }
(cd "$OUT" && apt-get -q -o APT::Sandbox::User=root download "$KPKG" >/dev/null)
mkdir -p "$K"
dpkg-deb -x "$OUT"/"$KPKG"_*.deb "$K"
REL=$(ls "$K/lib/modules")
depmod -b "$K" "$REL"
cp "$K/boot/vmlinuz-$REL" "$OUT/vmlinuz"

echo "vm-image: initramfs"
mkdir -p "$I"/{bin,sbin,etc,proc,sys,dev,newroot,lib/modules}
cp "$BUSYBOX" "$I/bin/busybox"
cp "$AGENT" "$I/sbin/warren-agent"
chmod 0755 "$I/bin/busybox" "$I/sbin/warren-agent"
: >"$I/etc/modules.list"
for m in virtio_pci virtio_blk virtio_console virtio_input evdev ext4 bochs; do
  modprobe -d "$K" -S "$REL" --show-depends "$m" | awk '/^insmod/ { print $2 }' | while read -r f; do
    rel=${f#"$K/lib/modules/$REL/"}
    # crc32c-intel needs SSE4.2; crc32c_generic does the same work everywhere
    case "$rel" in */crc32c-intel.ko) continue ;; esac
    grep -qxF "$rel" "$I/etc/modules.list" && continue
    mkdir -p "$I/lib/modules/$(dirname "$rel")"
    cp "$f" "$I/lib/modules/$rel"
    echo "$rel" >>"$I/etc/modules.list"
  done
done
install -m 0755 "$HERE/vm-guest/init" "$I/init"
(cd "$I" && find . -mindepth 1 | cpio --quiet -o -H newc --owner 0:0) >"$OUT/initrd"

echo "vm-image: desktop"
install -D -m 0755 "$HERE/vm-guest/desktop" "$R/usr/local/lib/warren/desktop"
install -D -m 0644 "$HERE/vm-guest/xorg.conf" "$R/etc/X11/xorg.conf"
install -D -m 0644 "$HERE/vm-guest/twmrc" "$R/root/.twmrc"
echo warren >"$R/etc/hostname"
# Nothing in the image uses these: package caches, docs, translations, and Mesa's
# GL drivers with the LLVM they load (X runs without acceleration here).
rm -rf "$R"/var/cache/apt/archives/*.deb "$R"/var/lib/apt/lists/* "$R"/usr/share/doc/* "$R"/usr/share/man/* "$R"/usr/share/locale/* \
  "$R"/usr/lib/x86_64-linux-gnu/dri "$R"/usr/lib/x86_64-linux-gnu/libLLVM-*.so* "$R"/usr/lib/x86_64-linux-gnu/libz3.so*

used=$(du -sm "$R" | cut -f1)
size=$(( (used * 5 / 4 + 64 + 63) / 64 * 64 ))
echo "vm-image: ext4 root of ${size} MiB (${used} MiB used)"
mkfs.ext4 -q -F -L warren-desktop -m 0 -E root_owner=0:0 -d "$R" "$OUT/base.img" "${size}M"
chmod 0644 "$OUT/base.img" "$OUT/vmlinuz" "$OUT/initrd"
printf 'KERNEL_RELEASE=%s\nBASE_MB=%s\nUSED_MB=%s\n' "$REL" "$size" "$used" >"$OUT/image.env"
rm -rf "$R" "$K" "$I" "$OUT"/*.deb
echo "vm-image: done"

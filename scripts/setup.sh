#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian 12 machine (as root): system packages,
# npm packages, and the build (native addon, static helpers, BPF, TypeScript).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential python3 make g++ pkg-config   # node-gyp and the static helpers
  clang llvm libbpf-dev bpftool                 # bpf/ programs
  libseccomp-dev                                # seccomp filters in the native helper
  python3-dev                                   # headers of the FnCall python3 zygote's fork server (native/helper/zygote)
  apparmor                                      # apparmor_parser: CI compiles apparmor/ profiles (-Q -K)
  erofs-utils                                   # layer images (mkfs.erofs)
  debootstrap                                   # the default Debian image
  busybox-static                                # test images
  runc                                          # benchmark baseline
  criu                                          # hibernate (checkpoint/restore); its probe names what the kernel lacks
  iproute2 nftables util-linux tar gzip zstd    # networking and archives
  chromium fonts-dejavu-core                    # dashboard tests (headless, test/ui) and its screenshots
  python3-httpx python3-websockets              # the Python SDK (python/)
  etcd-server etcd-client                       # the cluster store (warren node / warren gateway, test/cluster)
  python3-pytest                                # its tests (scripts/test.sh)
  python3-setuptools python3-mypy               # pip install ./python offline; lint type-checks it
  docker-registry skopeo                        # OCI registry of layer tests and benchmarks (the CNCF distribution registry); staging copies
  fuse3 libfuse3-dev libcurl4-openssl-dev libssl-dev   # warren-lazyfs (native/lazyfs): layers mounted from a registry, read on demand
  # microvm backend: QEMU (microvm machine), and Debian's cloud kernel as the guest kernel. Installing
  # the kernel also pulls initramfs-tools, kmod and linux-base, writes /boot/{vmlinuz,initrd.img,config,
  # System.map}-*-cloud-amd64 and the /vmlinuz and /initrd.img links (no bootloader is installed or
  # touched), and may upgrade the systemd packages (see docs/microvm.md).
  qemu-system-x86 qemu-utils linux-image-cloud-amd64 kmod cpio e2fsprogs
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Kernel limits a node of 10,000 sandboxes needs (docs/density.md); `warren up` raises the same
# ones at start and reports what it could not (src/shim/host-tunables.ts). Never lowered.
cat > /etc/sysctl.d/90-warren.conf <<'SYSCTL'
kernel.pid_max = 4194304
kernel.threads-max = 80000
user.max_pid_namespaces = 20000
user.max_mnt_namespaces = 20000
user.max_net_namespaces = 20000
user.max_ipc_namespaces = 20000
user.max_uts_namespaces = 20000
user.max_cgroup_namespaces = 20000
SYSCTL
while read -r key _ value; do
  [ -n "$key" ] || continue
  current=$(sysctl -n "$key" 2>/dev/null || echo 0)
  if [ "$current" -lt "$value" ]; then sysctl -q -w "$key=$value" || echo "setup: cannot raise $key to $value" >&2; fi
done < /etc/sysctl.d/90-warren.conf

# Cgroup migrations without an RCU grace period each (src/shim/host-tunables.ts, which `warren up`
# applies at start too): favordynmods on the cgroup2 mount, or the first cgroup mount without one.
cgroup_mnt=$(awk '$3=="cgroup2"{print $2; exit}' /proc/self/mounts)
[ -n "$cgroup_mnt" ] || cgroup_mnt=$(awk '$3=="cgroup"{print $2; exit}' /proc/self/mounts)
if [ -n "$cgroup_mnt" ] && ! awk '$3=="cgroup2"||$3=="cgroup"{print $4}' /proc/self/mounts | grep -q favordynmods; then
  mount -o remount,favordynmods "$cgroup_mnt" || echo "setup: cannot set favordynmods on $cgroup_mnt" >&2
fi

# The unprivileged user jailed microVM monitors drop to (src/shim/backends/microvm/vmm.ts).
id warren-vmm >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin warren-vmm
# Firecracker (where installed) runs as that user from its start, so it opens /dev/kvm as it.
if getent group kvm >/dev/null && ! id -nG warren-vmm | grep -qw kvm; then usermod -aG kvm warren-vmm; fi

if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "setup: npm ci" >&2
  npm ci --no-audit --no-fund --loglevel=error
fi

echo "setup: building" >&2
npm run --silent build

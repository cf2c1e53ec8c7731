#!/usr/bin/env bash
# Build the cgroup v2 guest node (rhp_devenv.v2node) from Debian bookworm packages.
#
#   bash scripts/build-v2node.sh     (as root; prints the build's directory on stdout, logs on stderr)
#
# Makes $RHP_V2NODE_PREFIX/<key>/ (default prefix /opt/runtime-hook-proxy/v2node) holding
#   vmlinuz      the kernel of linux-image-amd64, unpacked with dpkg-deb (not installed here)
#   initrd.img   busybox-static and the modules the root needs (virtio, ext4, 9p, overlay) and
#                virtio_net (the NIC of a guest with forwards, rhp_devenv.v2node)
#   rootfs.img   ext4 (mke2fs -d) of a bookworm tree by mmdebstrap: systemd as PID 1, dbus, runc,
#                python3, busybox-static, the project's containerd 2.1 (copied from
#                $RHP_CONTAINERD_PREFIX/2.1, config: SystemdCgroup = true, NRI on) and the
#                command agent (devenv/v2node/)
# <key> hashes this script, devenv/v2node/, the containerd 2.1 binaries and the kernel version
# apt would fetch: a second run with nothing changed builds nothing. $RHP_V2NODE_PREFIX/current
# links to the last build. Needs the network to deb.debian.org (or the machine's mirror) only
# for a cold build. Serialized by a lock. The guest never gets a network device (-nic none).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PREFIX=${RHP_V2NODE_PREFIX:-/opt/runtime-hook-proxy/v2node}
CONTAINERD=${RHP_CONTAINERD_PREFIX:-/opt/runtime-hook-proxy/containerd}/2.1
SUITE=bookworm
PACKAGES=systemd,systemd-sysv,dbus,runc,python3,busybox-static,ca-certificates
MODULES=(virtio_pci virtio_blk virtio_net crc32c_generic ext4 9pnet_virtio 9p overlay)
export DEBIAN_FRONTEND=noninteractive

RHP_PROGRESS_NAME=build-v2node
# shellcheck source=packaging/lib/progress.sh
source packaging/lib/progress.sh
log() { rhp_step "$*"; }

if [[ $(id -u) -ne 0 ]]; then
  log "must run as root (mmdebstrap, a root-owned tree)"
  exit 1
fi
for tool in mmdebstrap mke2fs cpio depmod busybox qemu-system-x86_64; do
  command -v "$tool" >/dev/null || { log "missing $tool: run scripts/install-deps.sh"; exit 1; }
done
if [[ ! -x $CONTAINERD/usr/bin/containerd ]]; then
  log "no containerd 2.1 under $CONTAINERD: run scripts/install-deps.sh"
  exit 1
fi

kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
kver=$(apt-cache show "$kpkg" 2>/dev/null | awk '/^Version:/ {print $2; exit}')
[[ -n $kpkg && -n $kver ]] || { log "apt knows no linux-image-amd64 (apt-get update?)"; exit 1; }

key=$({
  cat "${BASH_SOURCE[0]}" devenv/v2node/*
  sha256sum "$CONTAINERD"/usr/bin/*
  printf '%s %s %s %s\n' "$kpkg" "$kver" "$SUITE" "$PACKAGES"
} | sha256sum | cut -c1-16)
dest=$PREFIX/$key
mkdir -p "$PREFIX"
exec 8>"$PREFIX/.build.lock"
flock 8

if [[ -r $dest/rootfs.img && -r $dest/initrd.img && -r $dest/vmlinuz ]]; then
  log "up to date: $dest"
else
  log "building the v2 node ($kpkg $kver, $SUITE) into $dest"
  rm -rf "$PREFIX"/*.tmp
  tmp=$dest.tmp
  mkdir -p "$tmp/kernel" "$tmp/initrd/modules" "$tmp/initrd/bin"

  fetch_kernel() (cd "$tmp" && apt-get download -q "$kpkg=$kver" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2 || true; dpkg-deb -x "$tmp"/linux-image-*.deb "$tmp/kernel" && rm -f "$tmp"/linux-image-*.deb)
  rhp_run "kernel: apt-get download $kpkg ($kver) and unpack" fetch_kernel
  kdir=$(ls -d "$tmp"/kernel/lib/modules/*)
  depmod -b "$tmp/kernel" "$(basename "$kdir")" # the package leaves modules.dep to its postinst
  cp "$tmp"/kernel/boot/vmlinuz-* "$tmp/vmlinuz"

  make_initrd() {
    # each wanted module after its dependencies (modules.dep), once
    local -A seen=()
    local -a order=()
    add() {
      local name=$1 line path dep
      line=$(grep -E "/${name//_/[_-]}\.ko:" "$kdir/modules.dep" | head -1) || true
      [[ -n $line ]] || return 0 # built in
      path=${line%%:*}
      [[ -n ${seen[$path]:-} ]] && return 0
      seen[$path]=1
      for dep in ${line#*:}; do
        dep=$(basename "$dep" .ko)
        add "$dep"
      done
      order+=("$path")
    }
    local m
    for m in "${MODULES[@]}"; do add "$m"; done
    ((${#order[@]})) || { log "no module found in $kdir/modules.dep"; return 1; }
    : >"$tmp/initrd/modules.order"
    for m in "${order[@]}"; do
      cp "$kdir/$m" "$tmp/initrd/modules/"
      basename "$m" >>"$tmp/initrd/modules.order"
    done
    cp /bin/busybox "$tmp/initrd/bin/busybox"
    install -m 0755 devenv/v2node/init "$tmp/initrd/init"
    (cd "$tmp/initrd" && find . | cpio -o -H newc --quiet | gzip -1) >"$tmp/initrd.img"
  }
  rhp_run "initrd: busybox and ${#MODULES[@]} modules with their dependencies" make_initrd
  rm -rf "$tmp/kernel" "$tmp/initrd"

  tree=$tmp/tree
  # mmdebstrap's tree is kept as a tarball keyed by the suite and the package list only, so
  # changing the node's own files rebuilds the image in seconds
  base=$PREFIX/base-$(printf '%s %s %s\n' "$SUITE" "$PACKAGES" "$(mmdebstrap --version)" | sha256sum | cut -c1-16).tar
  debstrap() {
    mmdebstrap --quiet --variant=minbase --format=tar --include="$PACKAGES" \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      "$SUITE" "$base.tmp" >&2
    mv "$base.tmp" "$base"
  }
  if [[ -r $base ]]; then
    log "root: mmdebstrap's tree cached in $base"
  else
    rm -f "$PREFIX"/base-*.tar "$PREFIX"/base-*.tar.tmp
    rhp_run "root: mmdebstrap $SUITE minbase + $PACKAGES" debstrap
  fi
  mkdir -p "$tree"
  rhp_run "root: unpack the tree" tar -C "$tree" -xf "$base"
  customize() {
    mkdir -p "$tree/opt/runtime-hook-proxy/containerd" "$tree/etc/containerd" "$tree/etc/nri/conf.d" \
      "$tree/opt/nri/plugins" "$tree/usr/local/sbin"
    cp -a "$CONTAINERD" "$tree/opt/runtime-hook-proxy/containerd/2.1"
    install -m 0644 devenv/v2node/config.toml "$tree/etc/containerd/config.toml"
    install -m 0644 devenv/v2node/containerd.service "$tree/etc/systemd/system/containerd.service"
    install -m 0644 devenv/v2node/rhp-agent.service "$tree/etc/systemd/system/rhp-agent.service"
    install -m 0755 devenv/v2node/rhp-agent.sh "$tree/usr/local/sbin/rhp-agent"
    ln -sf /etc/systemd/system/containerd.service "$tree/etc/systemd/system/multi-user.target.wants/containerd.service"
    ln -sf /etc/systemd/system/rhp-agent.service "$tree/etc/systemd/system/multi-user.target.wants/rhp-agent.service"
    echo v2node >"$tree/etc/hostname"
    printf '127.0.0.1 localhost v2node\n::1 localhost\n' >"$tree/etc/hosts"
    printf '/dev/vda / ext4 rw 0 1\n' >"$tree/etc/fstab"
    # no login prompt, no clock or network waits: only what the node needs
    local unit
    for unit in serial-getty@ttyS0.service getty@tty1.service systemd-timesyncd.service apt-daily.timer \
      apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer man-db.timer; do
      ln -sf /dev/null "$tree/etc/systemd/system/$unit"
    done
    rm -rf "$tree"/var/cache/apt/archives/*.deb "$tree"/var/lib/apt/lists/*
  }
  rhp_run "root: containerd 2.1, its config and units, the agent" customize

  # stdout is this script's answer (the directory): mke2fs -d says "Creating regular file" there
  # even with -q, which install-deps.sh then took for the path.
  mkimage() { mke2fs -q -t ext4 -L v2root -d "$tree" "$tmp/rootfs.img" 3G >&2; }
  rhp_run "rootfs.img: mke2fs -t ext4 -d ($(du -sh "$tree" | cut -f1) tree, 3G sparse)" mkimage
  rm -rf "$tree"
  printf '%s %s\n' "$kpkg" "$kver" >"$tmp/kernel-version"
  rm -rf "$dest"
  mv "$tmp" "$dest"
  log "built $dest"
fi
ln -sfn "$key" "$PREFIX/current.tmp"
mv -T "$PREFIX/current.tmp" "$PREFIX/current"
printf '%s\n' "$dest"

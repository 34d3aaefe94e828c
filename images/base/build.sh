#!/usr/bin/env bash
# Build the registry-free base image: Debian bookworm (debootstrap) + python3 venv + tini + git,
# imported with `docker import`. The hub and single-user Dockerfiles build FROM it.
#
#   images/base/build.sh [IMAGE]          (default: gpu-jupyterhub/base:bookworm)
#
# Environment:
#   DEBIAN_MIRROR   Debian mirror for debootstrap (default http://deb.debian.org/debian)
#   ROOTFS_CACHE    where the unpacked root filesystem is kept between builds
#                   (default /var/cache/gpu-jupyterhub/rootfs-bookworm)
#   FORCE=1         rebuild even if an image built from this script already exists
#
# Idempotent: the image carries a label with this script's hash; a matching image is kept.
set -euo pipefail

IMAGE=${1:-gpu-jupyterhub/base:bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
ROOTFS=${ROOTFS_CACHE:-/var/cache/gpu-jupyterhub/rootfs-bookworm}
HERE=$(cd "$(dirname "$0")" && pwd)
RECIPE=$(sha256sum "$HERE/build.sh" | cut -c1-16)

die() { echo "images/base/build.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap and chroot); run it with sudo"
command -v debootstrap >/dev/null || die "debootstrap is missing; install it with: apt-get install -y debootstrap"
docker info >/dev/null 2>&1 || die "cannot reach the Docker engine; start it (make engine) and retry"

have=$(docker image inspect "$IMAGE" --format '{{index .Config.Labels "gpu-jupyterhub.recipe"}}' 2>/dev/null || true)
if [ "$have" = "$RECIPE" ] && [ "${FORCE:-0}" != 1 ]; then
  echo "base image $IMAGE is up to date (recipe $RECIPE)"
  exit 0
fi

unmount_all() {
  for d in dev/pts dev sys proc; do umount -l "$ROOTFS/$d" 2>/dev/null || true; done
}
trap unmount_all EXIT

if [ ! -x "$ROOTFS/usr/bin/apt-get" ]; then
  echo "debootstrap bookworm into $ROOTFS (about a minute)"
  rm -rf "$ROOTFS"
  mkdir -p "$ROOTFS"
  log=$(mktemp)
  debootstrap --variant=minbase bookworm "$ROOTFS" "$DEBIAN_MIRROR" >"$log" 2>&1 \
    || { tail -20 "$log" >&2; die "debootstrap failed (log above); check the mirror $DEBIAN_MIRROR"; }
  rm -f "$log"
fi

cp "$HERE/sources.list" "$ROOTFS/etc/apt/sources.list"
# Extra CA certificates of this machine (an intercepting proxy's, a company CA) go into the image,
# so pip and git inside containers trust the same endpoints the host does.
mkdir -p "$ROOTFS/usr/local/share/ca-certificates"
find /usr/local/share/ca-certificates -maxdepth 1 -name '*.crt' -exec cp {} "$ROOTFS/usr/local/share/ca-certificates/" \;
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
for d in proc sys dev dev/pts; do mount --bind "/$d" "$ROOTFS/$d"; done

echo "installing python3, tini, git into the base root filesystem"
log=$(mktemp)
chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  DEBIAN_FRONTEND=noninteractive bash -euc '
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends \
      python3 python3-venv ca-certificates tini git less procps >/dev/null
    update-ca-certificates >/dev/null
    apt-get clean
    rm -rf /var/lib/apt/lists/*
    [ -x /opt/venv/bin/pip ] || python3 -m venv /opt/venv
    id jovyan >/dev/null 2>&1 || useradd -m -u 1000 -s /bin/bash jovyan
  ' >"$log" 2>&1 || { tail -30 "$log" >&2; die "package installation in the chroot failed (log above)"; }
rm -f "$log"
unmount_all
: >"$ROOTFS/etc/resolv.conf"

echo "importing $IMAGE"
tar --numeric-owner -C "$ROOTFS" -c . | docker import \
  -c 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'ENV LANG=C.UTF-8' -c 'ENV SHELL=/bin/bash' \
  -c 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
  -c 'ENV REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt' \
  -c 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
  -c 'ENV PIP_DISABLE_PIP_VERSION_CHECK=1' \
  -c "LABEL gpu-jupyterhub.recipe=$RECIPE" \
  -c 'USER jovyan' -c 'WORKDIR /home/jovyan' \
  -c 'ENTRYPOINT ["/usr/bin/tini", "--"]' -c 'CMD ["/bin/bash"]' \
  - "$IMAGE" >/dev/null
echo "built $IMAGE"

#!/usr/bin/env bash
# Build the Dockerfile with podman where the base image cannot be pulled (no Docker Hub), and
# start the demo from the image until /healthz answers.
#
# A Debian bookworm root made by debootstrap, with Debian's own Python 3.11, stands in for
# python:3.11-slim-bookworm under that name; the Dockerfile itself is built unchanged. Needs
# root, `apt-get install podman runc debootstrap`, the Debian archive and PyPI.
#
#   bash contrib/container/build-standin.sh [ROOTFS]     # ROOTFS is kept and reused
set -euo pipefail
cd "$(dirname "$0")/../.."
rootfs=${1:-/var/tmp/pharos-standin-rootfs}
base=docker.io/library/python:3.11-slim-bookworm
image=localhost/pharos-router:standin
# Machines without CAP_SYS_RESOURCE cannot raise podman's default limits, and crun refuses
# hybrid cgroups: explicit limits, chroot isolation for the build, runc to run.
limits=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)

if [ ! -x "$rootfs/usr/bin/python3" ]; then
  debootstrap --variant=minbase \
    --include=python3,python3-pip,python3-venv,python-is-python3 bookworm "$rootfs"
fi
# The host's CA bundle, so pip inside the build trusts what the host trusts. Debian's pip
# refuses system-wide installs (PEP 668) unless told; the official image has no such rule.
cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
tar -C "$rootfs" -c . | podman import \
  --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' \
  --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
  --change 'CMD ["python3"]' - "$base" >/dev/null
podman build --quiet --format docker --isolation chroot --network host "${limits[@]}" \
  --pull=never -t "$image" .

podman --runtime runc run --rm "${limits[@]}" "$image" pharos --version
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cfg=$(mktemp)
trap 'rm -f "$cfg"' EXIT
printf 'listen: 127.0.0.1:%s\ndrain: {grace: 0s, timeout: 5s}\n' "$port" >"$cfg"
chmod 0644 "$cfg"
name=pharos-standin-$$
podman --runtime runc run --rm -d --name "$name" "${limits[@]}" --network host \
  -v "$cfg:/etc/pharos/demo.yaml:ro" "$image" \
  twistd -n --pidfile= pharos --demo -c /etc/pharos/demo.yaml >/dev/null
status=1
for _ in $(seq 1 120); do
  if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/healthz', timeout=2)" 2>/dev/null; then
    status=0
    break
  fi
  sleep 1
done
podman --runtime runc logs "$name" | tail -n 20
podman --runtime runc stop -t 20 "$name" >/dev/null
if [ "$status" = 0 ]; then echo "ok: $image serves the demo (/healthz 200)"; else echo "no /healthz"; fi
exit "$status"

#!/usr/bin/env bash
# Times a quick-start command on a fresh Debian 12 machine: a minimal Debian 12 root made with
# debootstrap (nothing of this machine's packages, venv, pip cache or ccache in it), the
# repository's committed tree copied in, the command run there with chroot, then run again to
# time the warm case. This is how docs/development.md's cold setup times were measured.
# Usage (as root): scripts/cold_machine.sh DIR [COMMAND...]   (default command: bash scripts/setup.sh)
#   DIR must not exist yet (debootstrap makes it, ~300 MB; the venv adds ~6 GB); rm -rf it after.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { echo "usage: scripts/cold_machine.sh DIR [COMMAND...]" >&2; exit 2; }
root=$1
shift
(($#)) || set -- bash scripts/setup.sh
[[ ! -e "$root" ]] || { echo "cold_machine: $root exists; give a new directory" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "cold_machine: needs debootstrap (apt-get install debootstrap)" >&2; exit 2; }

started=$(date +%s)
debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >"$root.debootstrap.log" 2>&1 ||
  { echo "cold_machine: debootstrap failed, see $root.debootstrap.log" >&2; exit 1; }
echo "cold_machine: Debian 12 minbase in $root ($(($(date +%s) - started)) s)"
# The machine's Debian mirror and suites (updates and security included) replace debootstrap's list.
if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
  cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
  rm -f "$root/etc/apt/sources.list"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The network's TLS trust for pip is the machine's, not the project's: its CA bundle goes beside
# Debian's (which the ca-certificates package rewrites) and PIP_CERT names it.
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/host-ca-certificates.crt"
mkdir -p "$root/src/gradaccum"
git archive HEAD | tar -x -C "$root/src/gradaccum"

mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/tmp"
trap 'umount -l "$root/proc" "$root/dev" "$root/tmp" 2>/dev/null || true' EXIT

run() {
  local t0
  t0=$(date +%s.%N)
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 PIP_CERT=/etc/host-ca-certificates.crt \
    bash -c 'cd /src/gradaccum && "$@"' bash "$@" >&2 || return 1
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'
}
echo "cold_machine: first run of: $*"
cold=$(run "$@") || { echo "cold_machine: the first run failed" >&2; exit 1; }
echo "cold_machine: second run of: $*"
warm=$(run "$@") || { echo "cold_machine: the second run failed" >&2; exit 1; }
echo "cold_machine: cold $cold s, warm $warm s: $*"

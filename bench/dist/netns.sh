#!/bin/bash
# Two "hosts" on one machine for the data-parallel benchmark: network
# namespaces ga0 and ga1 joined by a veth pair (ga-veth0 in ga0 = 10.213.0.1/24,
# ga-veth1 in ga1 = 10.213.0.2/24), each end's egress shaped by a token bucket
# filter, so both directions are limited to RATE.
#
#   bench/dist/netns.sh up RATE     (re)create and shape: RATE = 1gbit, 10gbit, ... or none
#   bench/dist/netns.sh down        remove everything (idempotent)
#   bench/dist/netns.sh status      show addresses and qdiscs
#
# Run a rank in a namespace with `ip netns exec ga0 ...` and tell Gloo which
# interface to use: GLOO_SOCKET_IFNAME=ga-veth0 (ga1: ga-veth1). The addresses
# exist only inside these namespaces; nothing leaves the machine.
set -euo pipefail

NS=(ga0 ga1)
DEV=(ga-veth0 ga-veth1)
ADDR=(10.213.0.1/24 10.213.0.2/24)

down() {
  for ns in "${NS[@]}"; do
    # Deleting a namespace deletes the veth end inside it, and with it the peer.
    if ip netns list | grep -qw "^$ns"; then ip netns del "$ns"; fi
  done
  # A veth left in the root namespace by an interrupted `up`.
  for dev in "${DEV[@]}"; do
    if ip link show "$dev" >/dev/null 2>&1; then ip link del "$dev"; fi
  done
}

# Token-bucket parameters for a rate such as 1gbit, 10gbit, 500mbit.
# burst: 4 ms of traffic at the rate (at least 64 KiB, a GSO segment), so the
# bucket, not the timer tick, sets the rate; latency: 20 ms of queue.
tbf_args() {
  local rate=$1 bps
  case "$rate" in
    *gbit) bps=$(( ${rate%gbit} * 1000000000 )) ;;
    *mbit) bps=$(( ${rate%mbit} * 1000000 )) ;;
    *kbit) bps=$(( ${rate%kbit} * 1000 )) ;;
    *) echo "netns.sh: unknown rate '$rate' (use e.g. 1gbit, 10gbit, 500mbit)" >&2; exit 2 ;;
  esac
  local burst=$(( bps / 8 / 250 ))
  (( burst < 65536 )) && burst=65536
  echo "rate $rate burst $burst latency 20ms"
}

up() {
  local rate=${1:?usage: netns.sh up RATE (e.g. 1gbit, 10gbit, none)}
  down
  for ns in "${NS[@]}"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
  done
  ip link add "${DEV[0]}" netns "${NS[0]}" type veth peer name "${DEV[1]}" netns "${NS[1]}"
  for i in 0 1; do
    ip -n "${NS[$i]}" addr add "${ADDR[$i]}" dev "${DEV[$i]}"
    ip -n "${NS[$i]}" link set "${DEV[$i]}" up
    if [[ "$rate" != none ]]; then
      # shellcheck disable=SC2046
      ip netns exec "${NS[$i]}" tc qdisc add dev "${DEV[$i]}" root tbf $(tbf_args "$rate")
    fi
  done
}

status() {
  for i in 0 1; do
    echo "== ${NS[$i]}"
    ip -n "${NS[$i]}" -brief addr show dev "${DEV[$i]}" || true
    ip netns exec "${NS[$i]}" tc qdisc show dev "${DEV[$i]}" || true
  done
}

case "${1:-}" in
  up) up "${2:-}" ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up RATE | down | status" >&2; exit 2 ;;
esac

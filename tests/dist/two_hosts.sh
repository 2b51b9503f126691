#!/usr/bin/env bash
# Two hosts on one machine: network namespaces deft_h1 and deft_h2 joined by a
# veth pair (10.77.0.1 and 10.77.0.2), one rank in each, over Open MPI's TCP
# transport on that subnet only. mpirun starts inside the first namespace and
# reaches the second through a launcher script that enters the namespace
# owning the address it is asked for (ssh's place). Needs root and iproute2:
# exit 77 (CTest: skipped) without them. Everything it made is removed on exit.
#   tests/dist/two_hosts.sh path/to/deft_dist_tests
set -euo pipefail
runner="$(realpath "${1:?usage: two_hosts.sh deft_dist_tests}")"
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
  echo "two_hosts: needs root and iproute2; skipped"
  exit 77
fi
h1=deft_h1 h2=deft_h2 subnet=10.77.0.0/24
work="$(mktemp -d)"
cleanup() {
  ip netns del "$h1" 2>/dev/null || true
  ip netns del "$h2" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
cleanup
mkdir -p "$work"
if ! ip netns add "$h1" 2>/dev/null; then
  echo "two_hosts: cannot create network namespaces here; skipped"
  exit 77
fi
ip netns add "$h2"
ip link add deft_v1 netns "$h1" type veth peer name deft_v2 netns "$h2"
ip -n "$h1" addr add 10.77.0.1/24 dev deft_v1
ip -n "$h2" addr add 10.77.0.2/24 dev deft_v2
for ns in "$h1" "$h2"; do
  ip -n "$ns" link set lo up
done
ip -n "$h1" link set deft_v1 up
ip -n "$h2" link set deft_v2 up

# mpirun's remote launch: "agent [options] HOST COMMAND...". The host is the
# first argument that is one of the two addresses.
cat > "$work/launch" <<LAUNCH
#!/usr/bin/env bash
while [ \$# -gt 0 ] && [ "\$1" != 10.77.0.1 ] && [ "\$1" != 10.77.0.2 ]; do shift; done
host="\$1"; shift
ns=$h1; [ "\$host" = 10.77.0.2 ] && ns=$h2
exec ip netns exec "\$ns" sh -c "\$*"
LAUNCH
chmod +x "$work/launch"

# Each rank checks that it runs in its own namespace: its veth address.
cat > "$work/where" <<WHERE
#!/usr/bin/env bash
ip -4 -o addr show | grep -o '10\.77\.0\.[12]' | head -1
WHERE
chmod +x "$work/where"

mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none --host 10.77.0.1:1,10.77.0.2:1 -np 2
     --mca plm_rsh_agent "$work/launch" --mca btl tcp,self
     --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet"
     -x DEFT_DIST_TIMEOUT_S=60 -x PATH)
echo "two_hosts: the ranks' addresses:"
addresses="$(ip netns exec "$h1" "${mpi[@]}" "$work/where" | sort | tr '\n' ' ')"
echo "$addresses"
[ "$addresses" = "10.77.0.1 10.77.0.2 " ] || { echo "two_hosts: the ranks did not run one in each namespace"; exit 1; }
rx() { ip -n "$h2" -s -j link show deft_v2 | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["rx"]["bytes"])'; }
before="$(rx)"
ip netns exec "$h1" "${mpi[@]}" "$runner" --run_test=collectives,data_parallel
crossed=$(( $(rx) - before ))
echo "two_hosts: $crossed bytes reached the second host over the veth pair"
# The suites allreduce a 3 MiB tensor among much else: it must have crossed.
[ "$crossed" -gt 2000000 ] || { echo "two_hosts: too little traffic crossed the veth pair"; exit 1; }

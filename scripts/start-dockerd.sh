#!/usr/bin/env bash
# Start a Docker engine when none answers; wait until it does. No bridge network and no iptables:
# sandboxes run with network_mode=none, and this machine may not allow iptables changes.
set -uo pipefail
if docker info >/dev/null 2>&1; then exit 0; fi
if ! command -v dockerd >/dev/null; then
  echo "envhub: dockerd is not installed; run 'make install' (installs docker.io)" >&2
  exit 1
fi
log=/var/log/envhub-dockerd.log
echo "envhub: starting dockerd (log: $log)"
setsid dockerd --iptables=false --bridge=none >"$log" 2>&1 < /dev/null &
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then exit 0; fi
  sleep 0.5
done
echo "envhub: dockerd did not answer within 30 s; last lines of $log:" >&2
tail -n 20 "$log" >&2
exit 1

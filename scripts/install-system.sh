#!/usr/bin/env bash
# Install the Debian packages envhub needs, only those missing. Usage: install-system.sh PKG...
set -euo pipefail
missing=()
for pkg in "$@"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "envhub: missing Debian packages: ${missing[*]}; run 'make install' as root or apt-get install them" >&2
  exit 1
fi
echo "envhub: installing ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

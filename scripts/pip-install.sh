#!/usr/bin/env bash
# `pip install ARGS` into PYTHON's environment, done by uv when $UV names it (else by pip itself).
# usage: UV=.venv/bin/uv pip-install.sh PYTHON ARGS...
#
# uv installs the same packages (the same `pip freeze`) several times faster: .venv took 36 s with uv against 132 s
# with pip on the 2-core machine, from the same local wheels. uv reads neither pip.conf nor PIP_* variables, so this
# carries pip's settings over (index URLs, find-links, constraints, timeout) and asks uv to weigh every index as pip
# does (unsafe-best-match).
#
# Bytecode: pip compiles every installed module at install time (about 150 CPU seconds for the two virtualenvs here);
# uv does not, and Python writes a module's .pyc when it first imports it, which compiles only what is used. The
# Makefile lets Python do so even where PYTHONDONTWRITEBYTECODE is set (see there).
set -euo pipefail
python=$1
shift
if [ -z "${UV:-}" ] || [ ! -x "$UV" ]; then
  exec "$python" -m pip install -q "$@"
fi

# `pip config list` merges pip.conf files and PIP_* variables; later lines (the environment) win
while IFS= read -r line; do
  key=${line%%=*}
  key=${key##*.}
  value=${line#*=}
  value=${value#\'}
  value=${value%\'}
  case $key in
    index-url) export UV_INDEX_URL=$value ;;
    extra-index-url) export UV_EXTRA_INDEX_URL=$value ;;
    find-links) export UV_FIND_LINKS=${value// /,} ;;
    constraint) export UV_CONSTRAINT=$value ;;
    default-timeout) export UV_HTTP_TIMEOUT=$value ;;
    cert) export SSL_CERT_FILE=${SSL_CERT_FILE:-$value} ;;
  esac
done < <("$python" -m pip config list 2>/dev/null || true)
export UV_INDEX_STRATEGY=${UV_INDEX_STRATEGY:-unsafe-best-match}
exec "$UV" pip install -q --python "$python" "$@"

#!/bin/sh
# Installs into a venv as the Makefile's layers do: with uv, trusting the machine's certificate store as pip does
# (--system-certs: by default uv reads only its own roots, and a network whose proxy's CA is in the system store, as
# corporate ones are, is refused: "invalid peer certificate"), compiled to bytecode as pip does; and where uv still
# cannot install (a CA that only pip's own config names, a proxy uv cannot pass), with pip, saying so in one line.
# INSTALLER=pip installs with pip alone.
#
#   containers/build/install.sh VENV_BIN ARG...     (ARG: what `pip install` takes; UV: another uv to run)
set -u
bin=$1
shift
if [ "${INSTALLER:-uv}" = uv ]; then
  "${UV:-$bin/uv}" pip install -q --system-certs --compile-bytecode --python "$bin/python" "$@"
  status=$?
  [ "$status" -eq 0 ] && exit 0
  [ "$status" -gt 128 ] && exit "$status" # stopped by a signal (Ctrl-C): nothing more
  echo "uv could not install that (its error is above); installing it with pip instead (INSTALLER=pip: pip alone)" >&2
fi
exec "$bin/pip" install -q "$@"

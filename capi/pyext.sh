#!/bin/sh
# Builds the Python package's CPython extensions beside libshmsteer.so: _fastkeys.abi3.so, behind
# shmsteer.Keys' key get (python/shmsteer/_fastkeys.c), and _faststep.abi3.so, behind a device
# worker's per-step resolve (python/shmsteer/_faststep.c); `go generate ./capi` runs it after
# the library. Each is compiled against this directory's shmsteer.h and calls the library only
# through the functions shmsteer._lib hands it, so neither is linked to the library.
#
# The interpreter whose headers it uses: $SHMSTEER_PYTHON, else /usr/bin/python3, else python3
# (the stable ABI: any CPython >= 3.10 loads it). Without Python.h (apt-get install python3-dev)
# it removes any stale copies and says so: the package then reads keys and resolves steps
# through ctypes.
set -eu
py=${SHMSTEER_PYTHON:-}
if [ -z "$py" ]; then
  if [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; else py=python3; fi
fi
inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null) || inc=
if [ -z "$inc" ] || [ ! -f "$inc/Python.h" ]; then
  rm -f ../python/shmsteer/_fastkeys.abi3.so ../python/shmsteer/_faststep.abi3.so
  echo "capi: no Python.h for $py (apt-get install python3-dev): python/shmsteer/_fastkeys and _faststep not built, shmsteer reads keys and resolves steps through ctypes" >&2
  exit 0
fi
for ext in _fastkeys _faststep; do
  out=../python/shmsteer/$ext.abi3.so
  ${CC:-cc} -O2 -fPIC -shared -std=gnu11 -Wall -Wextra -fvisibility=hidden -I"$inc" -I. \
    -o "$out.tmp" ../python/shmsteer/$ext.c
  mv "$out.tmp" "$out"
done

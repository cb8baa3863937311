#!/bin/sh
# Builds python/shmsteer/_fastkeys.abi3.so, the CPython extension behind shmsteer.Keys' key get
# (python/shmsteer/_fastkeys.c), beside libshmsteer.so; `go generate ./capi` runs it after the
# library. It is compiled against this directory's shmsteer.h and calls the library only
# through the functions shmsteer._lib hands it, so it is never linked to the library.
#
# The interpreter whose headers it uses: $SHMSTEER_PYTHON, else /usr/bin/python3, else python3
# (the stable ABI: any CPython >= 3.10 loads it). Without Python.h (apt-get install python3-dev)
# it removes any stale copy and says so: the package then reads keys through ctypes.
set -eu
out=../python/shmsteer/_fastkeys.abi3.so
py=${SHMSTEER_PYTHON:-}
if [ -z "$py" ]; then
  if [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; else py=python3; fi
fi
inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null) || inc=
if [ -z "$inc" ] || [ ! -f "$inc/Python.h" ]; then
  rm -f "$out"
  echo "capi: no Python.h for $py (apt-get install python3-dev): python/shmsteer/_fastkeys not built, shmsteer.Keys reads keys through ctypes" >&2
  exit 0
fi
${CC:-cc} -O2 -fPIC -shared -std=gnu11 -Wall -Wextra -fvisibility=hidden -I"$inc" -I. \
  -o "$out.tmp" ../python/shmsteer/_fastkeys.c
mv "$out.tmp" "$out"

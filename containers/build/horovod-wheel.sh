#!/usr/bin/env bash
# Build Horovod 0.28.1 (the last release) as a wheel against the frameworks already installed in PYTHON's
# environment (torch, TensorFlow, or both), and cache it so that it is built once per set of framework versions.
#
# Why: the PyPI sdist does not build against current torch as released. Its CMake files ask for C++14
# while torch 2.1+ headers need C++17 and torch 2.14's need C++20 (its headers #error otherwise), and
# its bundled gloo's cmake_minimum_required is rejected by CMake 4. We raise the standards in the
# sdist (C++17 for Horovod's core, as on Horovod's unreleased master; C++20 for its torch module).
# It also applies horovod-idle-cycle.patch (beside this script): an idle background thread waits for work; and,
# where TensorFlow is installed, horovod-tensorflow.patch (TF 2.21 and tf_keras; its header says what and why).
#
# Usage: containers/build/horovod-wheel.sh PYTHON WHEEL_CACHE_DIR
#   Prints the path of the wheel. Extra env: HOROVOD_GPU_OPERATIONS=NCCL etc. pass through
#   (the GPU image builds with NCCL and MPI; the local default builds CPU-only with Gloo).
#   If WHEEL_CACHE_DIR holds horovod-0.28.1.tar.gz, that sdist is used instead of downloading one.
set -euo pipefail
PYTHON=${1:?usage: horovod-wheel.sh PYTHON WHEEL_CACHE_DIR}
CACHE=${2:?usage: horovod-wheel.sh PYTHON WHEEL_CACHE_DIR}
VERSION=0.28.1
# The frameworks installed, and their versions: "torch-2.14.1", "tf-2.21.0" or both (the cache key's first part).
FRAMEWORKS=$("$PYTHON" - <<'PY'
import importlib.metadata as md
found = []
for key, dist in (("torch", "torch"), ("tf", "tensorflow-cpu"), ("tf", "tensorflow")):
    try:
        version = md.version(dist).split("+")[0]
    except md.PackageNotFoundError:
        continue
    if not any(f.startswith(key + "-") for f in found):
        found.append(f"{key}-{version}")
print("-".join(found))
PY
)
if [ -z "$FRAMEWORKS" ]; then
    echo "error: neither torch nor tensorflow is installed in $PYTHON's environment; install one before Horovod" >&2
    exit 2
fi
FLAVOUR=${HOROVOD_GPU_OPERATIONS:+nccl}
# Our patches to Horovod (their headers say what and why); the cache is keyed by their content.
HERE="$(cd "$(dirname "$0")" && pwd)"
PATCHES=("$HERE/horovod-idle-cycle.patch")
case "$FRAMEWORKS" in *tf-*) PATCHES+=("$HERE/horovod-tensorflow.patch") ;; esac
PATCHED=$(cat "${PATCHES[@]}" | sha256sum | cut -c1-12)
OUT="$CACHE/horovod-$VERSION-$FRAMEWORKS-${FLAVOUR:-cpu}-$PATCHED"
existing=$(ls "$OUT"/horovod-*.whl 2>/dev/null | head -n 1 || true)
if [ -n "$existing" ]; then echo "$existing"; exit 0; fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SDIST="$CACHE/horovod-$VERSION.tar.gz"  # an image build puts the sdist here (it cannot reach the index)
if [ ! -f "$SDIST" ]; then
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "horovod==$VERSION" -d "$WORK" >&2
    SDIST="$WORK/horovod-$VERSION.tar.gz"
fi
tar -xzf "$SDIST" -C "$WORK"
SRC="$WORK/horovod-$VERSION"
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$SRC/CMakeLists.txt"
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 20)/' "$SRC/horovod/torch/CMakeLists.txt"
for patch in "${PATCHES[@]}"; do patch --quiet -d "$SRC" -p1 < "$patch"; done

export HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MXNET=1
case "$FRAMEWORKS" in *torch-*) export HOROVOD_WITH_PYTORCH=1 ;; *) export HOROVOD_WITHOUT_PYTORCH=1 ;; esac
case "$FRAMEWORKS" in *tf-*) export HOROVOD_WITH_TENSORFLOW=1 ;; *) export HOROVOD_WITHOUT_TENSORFLOW=1 ;; esac
if [ -z "${HOROVOD_GPU_OPERATIONS:-}" ]; then
    # CPU flavour: torch here is a CUDA build and a CUDA compiler may be on PATH without a usable
    # toolkit beside it; Horovod would then try to compile its CUDA kernels. Tell it torch has no CUDA.
    export HOROVOD_WITHOUT_MPI=1
    sed -i 's/print(True if ((torch.version.cuda is not None) and (CUDA_HOME is not None)) else False)/print(False)/' \
        "$SRC/cmake/Modules/FindPytorch.cmake"
fi
export CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)"
"$PYTHON" -c 'import setuptools, wheel' 2>/dev/null || "$PYTHON" -m pip install --quiet setuptools wheel >&2
echo "building Horovod $VERSION against $FRAMEWORKS (4 to 10 minutes on 2 cores, once)" >&2
mkdir -p "$WORK/dist"
"$PYTHON" -m pip wheel --no-build-isolation --no-deps -w "$WORK/dist" "$SRC" >&2
mkdir -p "$OUT"
mv "$WORK"/dist/horovod-*.whl "$OUT/"
ls "$OUT"/horovod-*.whl

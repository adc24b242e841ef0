#!/usr/bin/env bash
# Installs trainyard's build dependencies from Debian packages. Idempotent: does nothing when all are there.
# Runs apt-get as root, or through sudo when started as another user.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libboost-graph-dev libboost-program-options-dev nlohmann-json3-dev libeigen3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  qt6-base-dev qt6-charts-dev qt6-svg-dev libgl-dev fonts-dejavu-core
  libqt6opengl6-dev  # Qt6Charts' CMake config needs Qt6OpenGL; only a Recommends of qt6-base-dev, so named here
  libopenmpi-dev openmpi-bin
  zlib1g-dev  # gzip'd profiler traces (traces/kineto.cpp)
  libsqlite3-dev  # Nsight Systems SQLite exports (traces/nsys.cpp)
  clang libclang-rt-14-dev  # the libFuzzer targets and the sanitizer builds (scripts/fuzz.sh, scripts/sanitize.sh)
  clang-format  # scripts/check_format.sh (Debian 12: clang-format 14, which .clang-format is written for)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  as_root=(sudo)
fi
echo "setup: installing ${missing[*]}"
"${as_root[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"

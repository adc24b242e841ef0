# Sourced by scripts/fuzz.sh and scripts/sanitize.sh: the one clang build with ASan+UBSan (build-asan) that holds both
# the libFuzzer targets and the unit tests, so CI compiles the instrumented libraries once for both stages.
# The libraries also carry libFuzzer's coverage hooks (fuzzer-no-link); in the test binaries the sanitizer runtime
# answers those hooks and they only cost time.
asan_build=build-asan

configure_asan_build() {
  local cxx launcher=() compiler=()
  cxx=$(command -v clang++ || command -v clang++-14 || true)
  [ -n "$cxx" ] || { echo "$0: clang++ not found: apt-get install clang libclang-rt-14-dev" >&2; exit 1; }
  if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
  # The compiler only on the first configure: naming another path to it later makes CMake drop the whole cache.
  [ -f "$asan_build/CMakeCache.txt" ] || compiler=(-DCMAKE_CXX_COMPILER="$cxx")
  cmake -S . -B "$asan_build" "${compiler[@]}" -DTRAINYARD_FUZZ=ON -DTRAINYARD_TESTS=ON -DTRAINYARD_CUDA=OFF \
    -DTRAINYARD_GUI=OFF -DTRAINYARD_BENCHMARKS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >/dev/null
}

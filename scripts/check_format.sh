#!/usr/bin/env bash
# Checks that the C++ and CUDA sources are laid out as .clang-format says (clang-format --dry-run -Werror); lists
# the files that differ and exits 1 when any does. With --fix, reformats them in place instead.
#   scripts/check_format.sh [--fix] [FILE...]     (no FILE: every *.cpp *.hpp *.cu *.cuh of the source folders)
# clang-format's layout changes between major versions: .clang-format is written for clang-format 14 (Debian 12's
# clang-format package), which this script prefers (clang-format-14, then clang-format; CLANG_FORMAT=path overrides).
set -euo pipefail
cd "$(dirname "$0")/.."

fix=0
if [ "${1:-}" = "--fix" ]; then
  fix=1
  shift
fi

clang_format=${CLANG_FORMAT:-}
if [ -z "$clang_format" ]; then
  for candidate in clang-format-14 clang-format; do
    if command -v "$candidate" >/dev/null; then
      clang_format=$candidate
      break
    fi
  done
fi
if [ -z "$clang_format" ] || ! command -v "$clang_format" >/dev/null; then
  echo "check_format: clang-format is not installed: install the Debian package clang-format" \
       "(sudo apt-get install clang-format; scripts/setup.sh installs it)" >&2
  exit 2
fi
[ -f .clang-format ] || { echo "check_format: .clang-format is missing from the repository root" >&2; exit 2; }
version=$("$clang_format" --version | sed -n 's/.*clang-format version \([0-9][0-9]*\)\..*/\1/p')
if [ "$version" != 14 ]; then
  echo "check_format: warning: $("$clang_format" --version) is not clang-format 14, which .clang-format is written for;" \
       "its layout may differ in places" >&2
fi

if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -d '' files < <(find app backend benchmarks common gui hwprofiles kernels models planner sim stacks tests \
    -type d -name 'build*' -prune -o -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' \) -print0 | sort -z)
fi
[ ${#files[@]} -gt 0 ] || { echo "check_format: no source files found" >&2; exit 2; }

if [ "$fix" -eq 1 ]; then
  "$clang_format" -i --style=file "${files[@]}"
  echo "check_format: formatted ${#files[@]} files with $("$clang_format" --version)"
  exit 0
fi

differ=()
for f in "${files[@]}"; do
  if ! out=$("$clang_format" --dry-run -Werror --ferror-limit=1 --style=file "$f" 2>&1); then
    # -Werror's findings say "code should be clang-formatted"; anything else (a crash, a missing file) is an error.
    if ! grep -q 'code should be clang-formatted' <<<"$out"; then
      echo "check_format: $clang_format failed on $f:" >&2
      echo "$out" >&2
      exit 2
    fi
    differ+=("$f")
  fi
done

if [ ${#differ[@]} -gt 0 ]; then
  echo "check_format: ${#differ[@]} of ${#files[@]} files differ from .clang-format's layout:" >&2
  printf '  %s\n' "${differ[@]}" >&2
  echo "check_format: see the changes with: $clang_format --style=file FILE | diff FILE -" >&2
  if [ ${#differ[@]} -le 10 ]; then
    echo "check_format: fix them with: scripts/check_format.sh --fix ${differ[*]}" >&2
  else
    echo "check_format: fix them with: scripts/check_format.sh --fix" >&2
  fi
  exit 1
fi
echo "check_format: all ${#files[@]} files match .clang-format ($("$clang_format" --version | sed 's/^.*clang-format version /clang-format /'))"

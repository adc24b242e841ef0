#!/usr/bin/env bash
# Regenerates the results part of docs/validation.md (between its markers) from `trainyard validate --markdown`,
# records the figures in validation/baseline.json (both modes) for CI's regression check and every case's error in
# validation/error_bars.json (the error bars), then rebuilds and writes README.md's accuracy section.
#   scripts/validation_doc.sh [path/to/trainyard]   (default build/trainyard)
set -euo pipefail
cd "$(dirname "$0")/.."
trainyard=${1:-build/trainyard}
tables=$(mktemp)
trap 'rm -f "$tables"' EXIT
# A larger budget than the default: the GPT 1T rows are the largest graphs (2.96 GiB peak for the whole run, 2026-11-27).
"$trainyard" validate --markdown --memory-budget 16G --write-baseline validation/baseline.json --write-error-bars validation/error_bars.json > "$tables"
"$trainyard" validate --fast --write-baseline validation/baseline.json > /dev/null
python3 - "$tables" <<'PY'
import sys
doc = open("docs/validation.md").read()
begin, end = "<!-- validate:begin -->", "<!-- validate:end -->"
if begin not in doc or end not in doc:
    sys.exit("docs/validation.md: the markers " + begin + " and " + end + " are missing")
tables = open(sys.argv[1]).read()
head, rest = doc.split(begin, 1)
_, tail = rest.split(end, 1)
open("docs/validation.md", "w").write(head + begin + "\n" + tables + end + tail)
PY
# The README's accuracy section, from the baseline just written and the error bars the full run recorded (built
# into the binary: rebuild it first).
cmake --build "$(dirname "$trainyard")" --target trainyard > /dev/null
"$trainyard" validate --accuracy-summary validation/baseline.json > "$tables"
python3 - "$tables" <<'PY'
import sys
doc = open("README.md").read()
begin, end = "<!-- accuracy:begin -->", "<!-- accuracy:end -->"
if begin not in doc or end not in doc:
    sys.exit("README.md: the markers " + begin + " and " + end + " are missing")
head, rest = doc.split(begin, 1)
_, tail = rest.split(end, 1)
open("README.md", "w").write(head + begin + "\n" + open(sys.argv[1]).read() + end + tail)
PY
echo "docs/validation.md, validation/baseline.json, validation/error_bars.json and README.md's accuracy section updated"

#!/usr/bin/env bash
# README command 1: install dependencies, build, and run the main job.
# The planner does not exist yet (issue 6), so the main job shows a built-in model on a built-in node.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
./build/trainyard show llama3-8b --hw dgx-a100 --seq 1M

#!/usr/bin/env bash
# README command 1: install dependencies, build, and run the main job.
# The main job: the plan search for Llama-3 8B at 1M tokens on a DGX A100, every scheme, with the winner explained.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
./build/trainyard plan --model llama3-8b --hw dgx-a100 --seq 1M --explain --out build/plan.json

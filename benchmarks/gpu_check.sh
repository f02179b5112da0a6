#!/usr/bin/env bash
# The GPU check (issue 15): one command, no network, a few minutes on one GPU. Writes benchmarks/results/gpu/gpu_check.json.
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmarks/gpu_check.py --out benchmarks/results/gpu/gpu_check.json "$@"

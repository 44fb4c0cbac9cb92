#!/usr/bin/env bash
# Sets up everything on a fresh Debian machine, builds, and runs the main job: `ffnlab evolve`,
# the FFN-evolution study (costs, speed, the toy run, every FFN variant trained as a byte-level
# language model over 3 paired seeds, activation sparsity, MoE balancing, MoE at equal compute, corrections of the
# FFN-evolution tutorial, recommendations, figures), written to report/ (18 minutes on 2 cores, measured).
# Extra arguments go to `ffnlab evolve` (e.g. --quick for a 15-second check of the pipeline once
# built, --full for the whole study).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release
cmake --build --preset release --target ffnlab_cli
./build/release/ffnlab evolve --out report "$@"
echo "Open report/REPORT.md"

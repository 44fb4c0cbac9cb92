#!/usr/bin/env bash
# Sets up everything on a fresh Debian machine, builds, and runs the main job: `ffnlab evolve`,
# the FFN-evolution study (costs, speed, the toy run, one FFN variant per step of the evolution
# trained as a byte-level language model on paired seeds (ReLU and SwiGLU 4, MoE at equal compute
# 3), activation sparsity, MoE balancing, corrections of the FFN-evolution tutorial,
# recommendations, figures), written to report/ (18 min 11 s on 2 cores of an AMD EPYC, measured).
# Extra arguments go to `ffnlab evolve` (e.g. --quick for a check of the pipeline, 14 s once
# built, --full for the whole study).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release
cmake --build --preset release --target ffnlab_cli
./build/release/ffnlab evolve --out report "$@"
echo "Open report/REPORT.md"

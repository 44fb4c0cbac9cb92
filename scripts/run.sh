#!/usr/bin/env bash
# Sets up everything on a fresh Debian machine, builds, and runs the main job. Until
# `ffnlab evolve` exists, the main job is: the cost table of the seed study's five FFN
# architectures, the seeds' toy experiment for each of them, and a byte-level language model with
# a SwiGLU FFN trained for 600 steps on the fortunes corpus (about a minute on two cores), with
# its validation bits per byte and a text sample. Extra arguments go to `ffnlab train`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release
cmake --build --preset release --target ffnlab_cli
mkdir -p runs
./build/release/ffnlab params
echo
./build/release/ffnlab toy --out runs/toy_log.csv
echo
./build/release/ffnlab train --variant swiglu --d-ff 344 --steps 600 --eval-every 200 \
  --out runs/train_swiglu "$@"

#!/usr/bin/env bash
# Sets up everything on a fresh Debian machine, builds, and runs the main job. Extra arguments go
# to the job. Until `ffnlab evolve` exists (issue 4 and later), the main job is the cost table of
# the seed study's five FFN architectures.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release
cmake --build --preset release --target ffnlab_cli
./build/release/ffnlab params "$@"

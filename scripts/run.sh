#!/usr/bin/env bash
# The main job on a fresh Debian machine: installs what the program needs (install-deps.sh run),
# builds the program alone (the `program` preset: release flags, no tests), and runs the
# FFN-evolution study, `ffnlab evolve`, into report/. Extra arguments go to `ffnlab evolve`:
# --quick checks the pipeline in under a minute, --full runs the whole study. README.md gives
# the measured times.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh run
cmake --preset program
cmake --build --preset program
./build/program/ffnlab evolve --out report "$@"
echo "Open report/REPORT.md"

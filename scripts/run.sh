#!/usr/bin/env bash
# The main job on a fresh Debian machine: installs what the program needs (install-deps.sh run),
# builds the program alone (the `program` preset: release flags, no tests), and runs the
# FFN-evolution study, `ffnlab evolve`, into report/ (with --quick into report-quick/, so that
# a check of the pipeline never meets a real study's report or runs). Extra arguments go to
# `ffnlab evolve`: --quick checks the pipeline in under a minute, --full runs the whole study,
# --resume continues a stopped one. README.md gives the measured times.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh run
cmake --preset program
cmake --build --preset program
out=report
for arg in "$@"; do
  if [[ "$arg" == --quick ]]; then out=report-quick; fi
done
./build/program/ffnlab evolve --out "$out" "$@"
echo "Open $out/REPORT.md"

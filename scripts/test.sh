#!/usr/bin/env bash
# Sets up everything on a fresh Debian machine, builds, and runs every test (CTest).
# Golden cases are written by PyTorch once per build (a build step), not per test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release
cmake --build --preset release
ctest --preset release

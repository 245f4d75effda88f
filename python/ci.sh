#!/usr/bin/env bash
# The Python package's CI: from the repository root, build the wheel with maturin, install it in a
# fresh virtual environment with the test dependencies, and run the pytest suite.
#   bash python/ci.sh          # all of it
#   bash python/ci.sh deps     # only the virtual environment and the test dependencies
#   bash python/ci.sh wheel    # the wheel and the tests, in the environment `deps` made
# Needs python3 (>= 3.10) with venv, a Rust toolchain and PyPI. The wheel is built in the shared
# target/ (release profile), so after `cargo test --release` only the bindings are compiled.
# `.ci/run` runs `deps` while cargo builds (downloads and unpacking, little CPU), then `wheel`.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=target/python-ci-venv
PIP=(--quiet --disable-pip-version-check)
# maturin writes the wheel under cargo's target directory, wherever CARGO_TARGET_DIR puts it.
WHEELS="${CARGO_TARGET_DIR:-target}/wheels"

make_venv() {
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install "${PIP[@]}" "maturin>=1.9,<2" \
        numpy scipy scikit-learn pyarrow pytest "datafusion==55.*" \
        scanpy igraph leidenalg umap-learn adbc-driver-flightsql
    touch "$VENV/.test-dependencies"
}

case "${1:-all}" in
    deps) make_venv; exit 0 ;;
    wheel) [ -f "$VENV/.test-dependencies" ] || make_venv ;;
    all) make_venv ;;
    *) echo "usage: bash python/ci.sh [deps|wheel]" >&2; exit 2 ;;
esac
rm -f "$WHEELS"/datafusion_sparse_knn-*.whl
"$VENV/bin/maturin" build --release -m python/Cargo.toml --interpreter "$VENV/bin/python"
# --force-reinstall --no-deps: a wheel of the same version replaces the one a run before installed.
"$VENV/bin/python" -m pip install "${PIP[@]}" --force-reinstall --no-deps "$WHEELS"/datafusion_sparse_knn-*.whl
# -p no:cacheprovider: leave no .pytest_cache in the work tree.
"$VENV/bin/python" -m pytest -p no:cacheprovider python/tests

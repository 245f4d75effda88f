#!/usr/bin/env bash
# The Python package's CI: from the repository root, build the wheel with maturin, install it in a
# fresh virtual environment with the test dependencies, and run the pytest suite.
#   bash python/ci.sh
# Needs python3 (>= 3.10) with venv, a Rust toolchain and PyPI. The wheel is built in the shared
# target/ (release profile), so after `cargo test --release` only the bindings are compiled.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=target/python-ci-venv
PIP=(--quiet --disable-pip-version-check)
# maturin writes the wheel under cargo's target directory, wherever CARGO_TARGET_DIR puts it.
WHEELS="${CARGO_TARGET_DIR:-target}/wheels"
rm -rf "$VENV" "$WHEELS"/datafusion_sparse_knn-*.whl
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install "${PIP[@]}" "maturin>=1.9,<2"
"$VENV/bin/maturin" build --release -m python/Cargo.toml --interpreter "$VENV/bin/python"
"$VENV/bin/python" -m pip install "${PIP[@]}" "$WHEELS"/datafusion_sparse_knn-*.whl \
    numpy scipy scikit-learn pyarrow pytest "datafusion==55.*" \
    scanpy igraph leidenalg umap-learn adbc-driver-flightsql
# -p no:cacheprovider: leave no .pytest_cache in the work tree.
"$VENV/bin/python" -m pytest -p no:cacheprovider python/tests

#!/usr/bin/env bash
# Install devrng (in the core environment) and run its main job: the self-test
# on every available backend, then the quick-start example.
source "$(dirname "$0")/_venv.sh"
venv=$(venv_for core)
"$venv/bin/devrng" selftest
"$venv/bin/python" "$DEVRNG_ROOT/examples/quickstart.py"

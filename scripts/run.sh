#!/usr/bin/env bash
# Install devrng in an environment of its own (torch, NumPy and devrng only; see run_venv in
# _venv.sh for where its torch comes from) and run its main job: the self-test on every
# available backend, then the quick-start example.
source "$(dirname "$0")/_venv.sh"
venv=$(run_venv)
echo "== devrng selftest" >&2
"$venv/bin/devrng" selftest
echo "== examples/quickstart.py" >&2
"$venv/bin/python" "$DEVRNG_ROOT/examples/quickstart.py"

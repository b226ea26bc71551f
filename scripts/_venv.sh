# Sourced by scripts/*.sh. venv_for NAME prints the path of a ready virtual
# environment built from envs/NAME.txt, building it first if needed.
# Environments live outside the clone, keyed by a hash of what they install
# and the Python version, so a machine that built one never downloads it again.
#
# A build is finished when its folder holds `.complete`, written last, after pip and a smoke
# import succeeded (it names the modules); a folder without it is a build that failed or was
# stopped, and the next run starts it again. (The build happens in its final folder, not in one renamed into place:
# a virtual environment cannot move, its scripts name their interpreter by absolute path.)
# Each environment has a lock (`<folder>.lock`, flock): a second run that wants it while
# another builds or updates it waits, says so, and then uses what the first one built.
set -euo pipefail
DEVRNG_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEVRNG_CACHE=${DEVRNG_CACHE:-$HOME/.cache/devrng}
PYTHON=${PYTHON:-python3}

_DEVRNG_LOCK_FD=""
_lock() {  # _lock DIR: hold DIR's lock until _unlock (or until this shell exits)
    mkdir -p "$(dirname "$1")"
    if ! command -v flock > /dev/null; then
        echo "== (no flock command here: nothing stops another run from building $1 too)" >&2
        return 0
    fi
    exec {_DEVRNG_LOCK_FD}>>"$1.lock"
    if ! flock -n "$_DEVRNG_LOCK_FD"; then
        echo "== waiting: another run is building or updating $1 (it holds $1.lock)" >&2
        flock "$_DEVRNG_LOCK_FD"
        echo "== the other run is done with $1: going on" >&2
    fi
}

_unlock() {
    if [ -n "$_DEVRNG_LOCK_FD" ]; then exec {_DEVRNG_LOCK_FD}>&-; _DEVRNG_LOCK_FD=""; fi
}

# _build DIR WHAT SMOKE COMMAND...: DIR built again from nothing: a new virtual environment,
# then COMMAND DIR (the install), then SMOKE's modules imported in it; marked finished only
# when all three succeeded. The caller holds DIR's lock.
_build() {
    local dir=$1 what=$2 smoke=$3 failed=""
    shift 3
    if [ -e "$dir" ]; then
        echo "== $dir holds an unfinished build of $what (a run failed or was stopped):" \
            "removing it and building again" >&2
        rm -rf "$dir"
    fi
    if ! "$PYTHON" -m venv "$dir"; then
        failed="creating it ($PYTHON -m venv)"
    elif ! "$@" "$dir"; then
        failed="installing its packages (pip's messages are above)"
    elif ! _smoke "$dir" "$smoke"; then
        failed="the smoke import (import ${smoke// /, })"
    fi
    if [ -n "$failed" ]; then
        rm -rf "$dir"
        echo "== FAILED: building $what in $dir: $failed. Nothing of it was kept:" \
            "the next run builds it again." >&2
        return 1
    fi
    _mark_finished "$dir" "$smoke"
}

_smoke() {  # _smoke DIR MODULES: import each of MODULES with DIR's python
    # shellcheck disable=SC2086  # (MODULES: one word per module)
    "$1/bin/python" -c 'import importlib, sys
for name in sys.argv[1:]: importlib.import_module(name)' $2
}

_mark_finished() {  # _mark_finished DIR SMOKE: DIR/.complete, written whole or not at all
    echo "smoke import passed: ${2:-(nothing to import)}" > "$1/.complete.new"
    mv "$1/.complete.new" "$1/.complete"
}

# _finished DIR WHAT SMOKE: whether DIR holds a finished build. An empty mark was left by an
# older version of this script, which wrote it even after pip failed: it is trusted once
# the smoke import passes (and then filled in); otherwise it goes, and the caller builds.
_finished() {
    local dir=$1 what=$2 smoke=$3
    [ -f "$dir/.complete" ] || return 1
    [ -s "$dir/.complete" ] && return 0
    if _smoke "$dir" "$smoke" 2> /dev/null; then
        _mark_finished "$dir" "$smoke"
        return 0
    fi
    echo "== $dir was marked finished by an older scripts/_venv.sh, but cannot import" \
        "${smoke// /, }: its install had failed; building $what again" >&2
    rm -f "$dir/.complete"
    return 1
}

# The modules a build must import before it counts as finished: those of torch, NumPy and
# pytest, the ones every check needs, when REQ names them.
_smoke_for() {
    grep -o -E '^(torch|numpy|pytest)==' "$1" | tr -d '=' | xargs || true
}

_install_requirements() {  # _install_requirements REQ DIR
    # The local wheel folder holds the CPU build of torch 2.13 on these machines.
    local extra=()
    [ -d /opt/wheels ] && extra+=(--find-links /opt/wheels)
    # (This machine's pip config names local index folders that may be absent; pip
    # warns once per package about them, which only buries real errors.)
    "$2/bin/python" -m pip install --quiet "${extra[@]}" -r "$1" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) >&2
}

venv_for() {
    local name=$1 req="$DEVRNG_ROOT/envs/$1.txt" key dir smoke
    if [ ! -f "$req" ]; then
        echo "== there is no environment '$name': envs/ names" \
            "$(cd "$DEVRNG_ROOT/envs" && ls -- *.txt | sed 's/\.txt$//' | tr '\n' ' ')" >&2
        return 1
    fi
    key=$( (cat "$req"; "$PYTHON" --version) | sha256sum | cut -c1-12)
    dir="$DEVRNG_CACHE/venvs/$name-$key"
    smoke=$(_smoke_for "$req")
    _lock "$dir"
    if ! _finished "$dir" "the $name environment" "$smoke"; then
        echo "== building the $name environment in $dir" >&2
        _build "$dir" "the $name environment" "$smoke" _install_requirements "$req" \
            || { _unlock; return 1; }
    fi
    # devrng itself: editable, no dependencies, no network.
    if ! "$dir/bin/python" -m pip install --quiet --no-deps --no-build-isolation \
            -e "$DEVRNG_ROOT" >&2; then
        _unlock
        echo "== FAILED: installing devrng from $DEVRNG_ROOT into the $name environment" \
            "(pip's messages are above); the environment itself is kept." >&2
        return 1
    fi
    _unlock
    echo "== the $name environment: $dir (enter it with: source $dir/bin/activate)" >&2
    echo "$dir"
}

_pip_filtered() {  # pip's output without the lines that only bury its progress
    grep -v -E "is ignored: it is neither a file nor a directory|^Requirement already satisfied|^Looking in (indexes|links)" >&2 || true
}

# run_venv prints the path of the main job's environment: torch, NumPy and devrng, nothing
# else (the test environments above add what CI needs: 5.7 GB for core). Its torch is, first
# found first:
#   1. the torch $PYTHON already imports (2.8 or newer, in its own site-packages or a
#      virtual environment's): the environment sees that folder, nothing is downloaded;
#   2. a CPU build of torch lying on this disk, in a folder pip reads (--find-links; on these
#      machines /opt/wheels holds torch 2.13.0+cpu);
#   3. the CPU build from PyTorch's own index (about 190 MB), not PyPI's CUDA build (5.5 GB).
# Then `pip install .`, as the README's Install section says. devrng is built again only
# when its source changed since the last run.
run_venv() {
    local torch_version="" wheel="" key dir how step=0
    local links=()
    [ -d /opt/wheels ] && links+=(--find-links /opt/wheels)
    say() { step=$((step + 1)); echo "== [$step] $*" >&2; }
    # Where $PYTHON's torch lives, if it has one of 2.8 or newer.
    local torch_site
    torch_site=$("$PYTHON" -c "import os, sys, torch
v = tuple(int(p) for p in torch.__version__.split('+')[0].split('.')[:2])
sys.exit(1) if v < (2, 8) else print(os.path.dirname(os.path.dirname(torch.__file__)), torch.__version__)" \
        2>/dev/null) || torch_site=""
    if [ -n "$torch_site" ]; then
        torch_version=${torch_site##* }
        torch_site=${torch_site% *}
        how="reuse:$torch_site:$torch_version"
    else
        # Which torch pip would take from this disk alone (no index asked, nothing fetched).
        wheel=$("$PYTHON" -m pip install --dry-run --no-index --no-deps --quiet --ignore-installed \
                    "${links[@]}" --report - "torch>=2.8" 2>/dev/null | "$PYTHON" -c "
import json, sys
from urllib.parse import unquote
found = json.load(sys.stdin)['install'][0]
if '+cpu' in found['metadata']['version'] and found['download_info']['url'].startswith('file://'):
    print(unquote(found['download_info']['url'][len('file://'):]))" 2>/dev/null) || true
        if [ -n "$wheel" ]; then how="file:$(basename "$wheel")"; else how="cpu-index"; fi
    fi
    key=$( (echo "$how"; "$PYTHON" --version) | sha256sum | cut -c1-12)
    dir="$DEVRNG_CACHE/venvs/run-$key"
    _lock "$dir"
    if ! _finished "$dir" "the main job's environment" torch; then
        say "a new environment in $dir"
        _build "$dir" "the main job's environment" torch _install_run_torch "$how" "$wheel" \
            || { _unlock; return 1; }
    fi
    # devrng from this tree, built (its C kernel compiled) when the source changed.
    local source_key
    source_key=$(cd "$DEVRNG_ROOT" && find src setup.py pyproject.toml README.md -type f \
        ! -name '*.so' ! -name '*.pyd' ! -name '*.sha256' ! -path '*__pycache__*' \
        ! -path '*.egg-info*' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-12)
    if [ "$(cat "$dir/.devrng-source" 2>/dev/null)" != "$source_key" ]; then
        say "devrng and NumPy: pip install $DEVRNG_ROOT (compiles devrng's C kernel)"
        # (The old mark goes first: a failed install must not leave it naming a source.)
        rm -f "$dir/.devrng-source"
        if ! "$dir/bin/python" -m pip install --progress-bar on "${links[@]}" "$DEVRNG_ROOT" \
                2>&1 | _pip_filtered; then
            _unlock
            echo "== FAILED: pip install $DEVRNG_ROOT into $dir (pip's messages are above);" \
                "the next run installs it again." >&2
            return 1
        fi
        if [ ! -x "$dir/bin/devrng" ] || ! "$dir/bin/python" -c "import devrng"; then
            _unlock
            echo "== FAILED: pip install $DEVRNG_ROOT left no working devrng in $dir (no" \
                "bin/devrng, or 'import devrng' failed above); the next run installs it again." >&2
            return 1
        fi
        echo "$source_key" > "$dir/.devrng-source"
    fi
    _unlock
    echo "== the main job's environment: $dir (enter it with: source $dir/bin/activate)" >&2
    echo "$dir"
}

# _install_run_torch HOW WHEEL DIR: torch for the main job's environment, as run_venv chose.
_install_run_torch() {
    local how=$1 wheel=$2 dir=$3 site links=()
    [ -d /opt/wheels ] && links+=(--find-links /opt/wheels)
    if [[ $how == reuse:* ]]; then
        # The folder that holds $PYTHON's torch joins the environment's path (a .pth
        # file): the environment uses that torch, and pip counts it as installed.
        local torch_site=${how#reuse:}
        torch_site=${torch_site%:*}
        say "torch ${how##*:}: the one $PYTHON has, in $torch_site (nothing to download)"
        site=$("$dir/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") \
            && echo "$torch_site" > "$site/devrng-run-reused-torch.pth"
    elif [[ $how == file:* ]]; then
        say "torch from $wheel ($(du -m "$wheel" | cut -f1) MB), with what it needs from PyPI"
        "$dir/bin/python" -m pip install --progress-bar on "${links[@]}" "$wheel" \
            2>&1 | _pip_filtered
    else
        say "torch's CPU build from https://download.pytorch.org/whl/cpu (about 190 MB" \
            "to download; PyPI's torch would be a 5.5 GB CUDA build)"
        "$dir/bin/python" -m pip install --progress-bar on torch \
            --index-url https://download.pytorch.org/whl/cpu 2>&1 | _pip_filtered
    fi
}

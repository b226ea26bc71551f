# Sourced by scripts/*.sh. venv_for NAME prints the path of a ready virtual
# environment built from envs/NAME.txt, building it first if needed.
# Environments live outside the clone, keyed by a hash of what they install
# and the Python version, so a machine that built one never downloads it again.
set -euo pipefail
DEVRNG_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEVRNG_CACHE=${DEVRNG_CACHE:-$HOME/.cache/devrng}
PYTHON=${PYTHON:-python3}

venv_for() {
    local name=$1 req="$DEVRNG_ROOT/envs/$1.txt" key dir
    key=$( (cat "$req"; "$PYTHON" --version) | sha256sum | cut -c1-12)
    dir="$DEVRNG_CACHE/venvs/$name-$key"
    if [ ! -f "$dir/.complete" ]; then
        echo "== building the $name environment in $dir" >&2
        rm -rf "$dir"
        "$PYTHON" -m venv "$dir"
        # The local wheel folder holds the CPU build of torch 2.13 on these machines.
        local extra=()
        [ -d /opt/wheels ] && extra+=(--find-links /opt/wheels)
        # (This machine's pip config names local index folders that may be absent; pip
        # warns once per package about them, which only buries real errors.)
        "$dir/bin/python" -m pip install --quiet "${extra[@]}" -r "$req" \
            2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) >&2
        touch "$dir/.complete"
    fi
    # devrng itself: editable, no dependencies, no network.
    "$dir/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e "$DEVRNG_ROOT" >&2
    echo "== the $name environment: $dir (enter it with: source $dir/bin/activate)" >&2
    echo "$dir"
}

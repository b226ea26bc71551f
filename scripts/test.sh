#!/usr/bin/env bash
# Build the test environments (once per machine) and run every check in each; --help says
# what, how long and how much disk.
usage() {
    cat <<'HELP'
Usage: bash scripts/test.sh [PYTEST ARGUMENTS...]     (--help: this text; it builds nothing)

Builds the test environments it needs (once per machine, under $DEVRNG_CACHE/venvs,
default ~/.cache/devrng/venvs) and runs, in each, what CI runs:
  core          torch 2.14 (what `pip install .` gets): ruff, mypy, the docs build, and
                the whole suite with simulated cuda/xpu/mps devices        (5.7 GB)
  xla           torch 2.9 + torch_xla + torchax + JAX on the CPU: the whole suite again
  ipex          torch 2.8 + Intel Extension for PyTorch (CPU build): the whole suite again
  integrations  torch 2.13 + Lightning, accelerate, HF transformers, torchdata: the
                trainer tests (tests/integrations) and the docstring examples
PYTEST ARGUMENTS go to every pytest run (e.g. -m "not slow", -k fork, -x).

  DEVRNG_ENVS   the environments to use (default "core xla ipex integrations")
  DEVRNG_JOBS   how many checks run at a time (default 2: this machine's cores)
  DEVRNG_CACHE  where the environments live (default ~/.cache/devrng)

The quick lane: the core environment only, without the tests marked slow (torchrun jobs,
gloo process groups, resumes and examples in fresh processes, the scripts' own tests):
  DEVRNG_ENVS=core bash scripts/test.sh -m "not slow"
Measured on a 2-core machine (README, "Developing devrng"): the core environment is 5.7 GB
and a few minutes to build once; the whole run is about 22 GB (every environment) and about
an hour once they are built, plus their first build.

While the checks run, a line says how far each has come (pytest's percentage); each
check's output is printed whole when it ends, then where the time went. The logs are
written to a temporary folder that is removed at the end. Exit status: 0 only when every
check passed and pytest ran at least one test in each environment.
HELP
}
for arg in "$@"; do
    if [ "$arg" = --help ] || [ "$arg" = -h ]; then usage; exit 0; fi
done
source "$(dirname "$0")/_venv.sh"
cd "$DEVRNG_ROOT"

envs=${DEVRNG_ENVS:-core xla ipex integrations}
jobs=${DEVRNG_JOBS:-2}
if ! [[ $jobs =~ ^[1-9][0-9]*$ ]]; then
    echo "DEVRNG_JOBS is '$jobs': it takes a whole number of checks to run at a time, 1 or more." >&2
    exit 2
fi
# This run's logs and docs site: removed when it ends, however it ends (a check still running
# then, after Ctrl-C, is stopped).
logs=$(mktemp -d "${TMPDIR:-/tmp}/devrng-test.XXXXXX")
declare -A pid_of=() label_of=() start_of=() log_of=()
ticker=""
cleanup() {
    local pid
    for pid in "${!pid_of[@]}" $ticker; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$logs"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
started=$SECONDS
declare -A venv=()
for env in $envs; do  # one at a time: downloads and disk, not the CPU, bound these
    t=$SECONDS
    venv[$env]=$(venv_for "$env")
    echo "== the $env environment is ready ($((SECONDS - t)) s)"
done
built=$((SECONDS - started))

# The checks, longest first (measured: a whole-suite run of xla or core takes the longest),
# as "label|command". pytest exits 5 when it ran no test: that is a failure here.
pytest_args=(-p no:cacheprovider --durations=15 "$@")
checks=()
for env in $envs; do
    py="${venv[$env]}/bin/python"
    case $env in
        core)
            checks+=("core: pytest|$py -m pytest ${pytest_args[*]@Q}")
            checks+=("core: ruff, mypy, docs|${venv[$env]}/bin/ruff check src tests benchmarks examples setup.py && ${venv[$env]}/bin/mypy && ${venv[$env]}/bin/properdocs build --strict --quiet --site-dir $logs/site") ;;
        integrations)
            checks+=("$env: pytest|$py -m pytest ${pytest_args[*]@Q} tests/integrations tests/test_docstrings.py") ;;
        *)
            checks+=("$env: pytest|PJRT_DEVICE=CPU $py -m pytest ${pytest_args[*]@Q}") ;;
    esac
done
order=()  # xla and core first: the two longest; any other environment's last
declare -A placed=()
for want in "xla:" "core: pytest" "ipex:" "integrations:" "core: ruff" ""; do
    for check in "${checks[@]}"; do
        if [[ $check == "$want"* ]] && [ -z "${placed[$check]:-}" ]; then
            order+=("$check")
            placed[$check]=1
        fi
    done
done

failed=()
took=()
finish() {  # finish PID RC: print that check's log and result
    local pid=$1 rc=$2
    local label=${label_of[$pid]} secs=$((SECONDS - ${start_of[$pid]}))
    echo
    echo "======== $label: exit $rc after $((secs / 60)) min $((secs % 60)) s ========"
    cat "${log_of[$pid]}"
    touch "${log_of[$pid]}.done"
    took+=("$(printf '%5d s  %s (exit %d)' "$secs" "$label" "$rc")")
    if [ "$rc" -ne 0 ]; then failed+=("$label (exit $rc)"); fi
    unset "pid_of[$pid]"
}
reap() {  # wait for the first running check to end, and finish it
    local rc=0 done_pid
    wait -n -p done_pid "${!pid_of[@]}" || rc=$?
    finish "$done_pid" "$rc"
}
# Progress while the checks run: every running check's last pytest percentage, on one line,
# when it changed (at most every 30 s).
progress() {
    local last="" said=$((SECONDS - 30)) line log pct
    while sleep 10 > /dev/null 2>&1; do  # (sleep given no pipe of ours: none kept open)
        line=""
        for log in "$logs"/*.log; do
            [ -e "$log" ] && [ ! -e "$log.done" ] || continue
            # (2>/dev/null: the folder goes at the end, maybe under this loop's feet.)
            pct=$(grep -o -E '\[ *[0-9]+%\]' "$log" 2> /dev/null | tail -n 1 | tr -d '[] ') || true
            line+="${line:+; }$(cat "${log%.log}.label" 2> /dev/null) ${pct:-running}"
        done
        if [ -n "$line" ] && [ "$line" != "$last" ] && [ $((SECONDS - said)) -ge 30 ]; then
            echo "== at $(((SECONDS - started) / 60)) min: $line"
            last=$line said=$SECONDS
        fi
    done
}
progress &
ticker=$!
echo "== each check's output is printed whole when it ends; until then it is in $logs" \
    "(tail -f its log to follow it; the folder is removed at the end)"
for check in "${order[@]}"; do
    while [ "${#pid_of[@]}" -ge "$jobs" ]; do
        reap
    done
    label=${check%%|*}
    command=${check#*|}
    # (Named before it starts: renaming it after would race the child's own open of it.)
    log_file="$logs/${#log_of[@]}.log"
    echo "$label" > "${log_file%.log}.label"
    bash -c "$command" > "$log_file" 2>&1 &
    pid=$!
    pid_of[$pid]=1 label_of[$pid]=$label start_of[$pid]=$SECONDS log_of[$pid]=$log_file
    echo "== started $label (at $((SECONDS - started)) s; log: $log_file)"
done
while [ "${#pid_of[@]}" -gt 0 ]; do
    reap
done

passed_total=0
failed_total=0
for log in "$logs"/*.log; do  # add up pytest's closing lines ("N passed, M failed, ...")
    line=$(grep -E '[0-9]+ (passed|failed|errors?|skipped|deselected).* in [0-9.]+s' "$log" | tail -n 1) || true
    if [[ $line =~ ([0-9]+)\ passed ]]; then passed_total=$((passed_total + BASH_REMATCH[1])); fi
    if [[ $line =~ ([0-9]+)\ failed ]]; then failed_total=$((failed_total + BASH_REMATCH[1])); fi
    if [[ $line =~ ([0-9]+)\ error ]]; then failed_total=$((failed_total + BASH_REMATCH[1])); fi
done
echo
echo "== where the time went ($jobs checks at a time)"
printf '%5d s  building or finding the environments\n' "$built"
printf '%s\n' "${took[@]}"
printf '%5d s  in all\n' "$((SECONDS - started))"
if [ ${#failed[@]} -ne 0 ]; then
    printf 'FAILED: %s\n' "${failed[@]}"
    echo "pytest: $passed_total passed, $failed_total failed"
    exit 1
fi
echo "all checks passed in: $envs"
echo "pytest: $passed_total passed, $failed_total failed"

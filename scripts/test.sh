#!/usr/bin/env bash
# Build the test environments (once per machine) and run every check in each.
#   core: torch 2.14 (what `pip install .` gets); lint, types, docs, the whole suite with
#         simulated devices
#   xla:  torch 2.9 + torch_xla 2.9 + torchax 0.0.13 + JAX 0.10.2 on the CPU, the whole suite again
#   ipex: torch 2.8 + intel-extension-for-pytorch 2.8 (CPU build), the whole suite with IPEX imported
#   integrations: torch 2.13 + Lightning, accelerate, HF transformers, torchdata; the trainer
#         tests (tests/integrations) and the docstring examples of devrng.integrations
# Choose environments with DEVRNG_ENVS="core" (default "core xla ipex integrations"); extra
# args go to pytest. The checks run DEVRNG_JOBS at a time (default 2: this machine's cores),
# each into a log of its own, printed whole when it ends; the end says where the time went.
source "$(dirname "$0")/_venv.sh"
cd "$DEVRNG_ROOT"

envs=${DEVRNG_ENVS:-core xla ipex integrations}
jobs=${DEVRNG_JOBS:-2}
logs=$(mktemp -d); echo "== logs in $logs"
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
            checks+=("core: ruff, mypy, docs|${venv[$env]}/bin/ruff check src tests benchmarks examples setup.py && ${venv[$env]}/bin/mypy && ${venv[$env]}/bin/properdocs build --strict --quiet --site-dir $(mktemp -d)") ;;
        integrations)
            checks+=("$env: pytest|$py -m pytest ${pytest_args[*]@Q} tests/integrations tests/test_docstrings.py") ;;
        *)
            checks+=("$env: pytest|PJRT_DEVICE=CPU $py -m pytest ${pytest_args[*]@Q}") ;;
    esac
done
order=()  # xla and core first: the two longest
for want in "xla:" "core: pytest" "ipex:" "integrations:" "core: ruff"; do
    for check in "${checks[@]}"; do
        [[ $check == "$want"* ]] && order+=("$check")
    done
done

declare -A pid_of=() label_of=() start_of=() log_of=()
failed=()
took=()
finish() {  # finish PID RC: print that check's log and result
    local pid=$1 rc=$2
    local label=${label_of[$pid]} secs=$((SECONDS - ${start_of[$pid]}))
    echo
    echo "======== $label: exit $rc after $((secs / 60)) min $((secs % 60)) s ========"
    cat "${log_of[$pid]}"
    took+=("$(printf '%5d s  %s (exit %d)' "$secs" "$label" "$rc")")
    if [ "$rc" -ne 0 ]; then failed+=("$label (exit $rc)"); fi
    unset "pid_of[$pid]"
}
reap() {  # wait for the first running check to end, and finish it
    local rc=0 done_pid
    wait -n -p done_pid "${!pid_of[@]}" || rc=$?
    finish "$done_pid" "$rc"
}
for check in "${order[@]}"; do
    while [ "${#pid_of[@]}" -ge "$jobs" ]; do
        reap
    done
    label=${check%%|*}
    command=${check#*|}
    # (Named before it starts: renaming it after would race the child's own open of it.)
    log_file="$logs/${#log_of[@]}.log"
    bash -c "$command" > "$log_file" 2>&1 &
    pid=$!
    pid_of[$pid]=1 label_of[$pid]=$label start_of[$pid]=$SECONDS log_of[$pid]=$log_file
    echo "== started $label (at $((SECONDS - started)) s)"
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

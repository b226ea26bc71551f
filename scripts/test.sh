#!/usr/bin/env bash
# Build the test environments (once per machine) and run every check in each.
#   core: torch 2.14 (what `pip install .` gets); lint, types, docs, the whole suite with
#         simulated devices
#   xla:  torch 2.9 + torch_xla 2.9 + torchax 0.0.13 + JAX 0.10.2 on the CPU, the whole suite again
#   ipex: torch 2.8 + intel-extension-for-pytorch 2.8 (CPU build), the whole suite with IPEX imported
#   integrations: torch 2.13 + Lightning, accelerate, HF transformers, torchdata; the trainer
#         tests (tests/integrations) and the docstring examples of devrng.integrations
# Choose environments with DEVRNG_ENVS="core" (default "core xla ipex integrations"); extra
# args go to pytest.
source "$(dirname "$0")/_venv.sh"
cd "$DEVRNG_ROOT"

failed=()
passed_total=0
failed_total=0
log=$(mktemp)
count() {  # add up pytest's closing line ("N passed, M failed, ...") from the last run
    local line
    line=$(grep -E '[0-9]+ (passed|failed|errors?|skipped|deselected).* in [0-9.]+s' "$log" | tail -n 1) || true
    if [[ $line =~ ([0-9]+)\ passed ]]; then passed_total=$((passed_total + BASH_REMATCH[1])); fi
    if [[ $line =~ ([0-9]+)\ failed ]]; then failed_total=$((failed_total + BASH_REMATCH[1])); fi
    if [[ $line =~ ([0-9]+)\ error ]]; then failed_total=$((failed_total + BASH_REMATCH[1])); fi
}
check() {  # check LABEL CMD...: run, remember failures, keep going
    local label=$1; shift
    echo "== $label: $*"
    local rc=0
    "$@" || rc=$?
    # pytest exits 5 when it ran no test: that is a failure here.
    if [ "$rc" -ne 0 ]; then failed+=("$label (exit $rc)"); fi
}

pytest_logged() {  # run pytest, showing its output and keeping a copy to count from
    "$@" 2>&1 | tee "$log"
    return "${PIPESTATUS[0]}"
}

envs=${DEVRNG_ENVS:-core xla ipex integrations}
for env in $envs; do
    venv=$(venv_for "$env")
    py="$venv/bin/python"
    if [ "$env" = core ]; then
        check "core: ruff" "$venv/bin/ruff" check src tests benchmarks examples setup.py
        check "core: mypy" "$venv/bin/mypy"
        check "core: docs" "$venv/bin/properdocs" build --strict --quiet --site-dir "$(mktemp -d)"
        check "core: pytest" pytest_logged "$py" -m pytest -p no:cacheprovider --durations=15 "$@"
    elif [ "$env" = integrations ]; then
        check "$env: pytest" pytest_logged "$py" -m pytest -p no:cacheprovider --durations=15 \
            tests/integrations tests/test_docstrings.py "$@"
    else
        check "$env: pytest" pytest_logged env PJRT_DEVICE=CPU "$py" -m pytest -p no:cacheprovider \
            --durations=15 "$@"
    fi
    count
done

if [ ${#failed[@]} -ne 0 ]; then
    printf 'FAILED: %s\n' "${failed[@]}"
    echo "pytest: $passed_total passed, $failed_total failed"
    exit 1
fi
echo "all checks passed in: $envs"
echo "pytest: $passed_total passed, $failed_total failed"

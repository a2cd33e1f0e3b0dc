#!/usr/bin/env bash
# Mutation score of the credit path, one module at a time, with mutmut (pip install mutmut; 3.x).
#
#   benchmarks/mutation.sh MODULE [TEST_FILE ...]
#   e.g. LABEL=before benchmarks/mutation.sh taspo_trl/credit/taspo.py tests/credit/test_taspo.py
#   LABEL=after SURVIVORS_OF=benchmarks/results/mutation_taspo_before.json \
#       benchmarks/mutation.sh taspo_trl/credit/taspo.py tests/credit/test_taspo.py
#
# MUTMUT_SECONDS bounds the run (a partial result: the unchecked mutants are counted as "not checked").
# LABEL names the result (mutation_<module>_<LABEL>.json). SURVIVORS_OF reruns only the survivors of an earlier
# result against the (larger) test selection and adds the earlier kills: adding tests cannot revive a mutant.
#
# Not part of the default test run. The [mutmut] section of setup.cfg holds the whole-path configuration
# (`mutmut run` there mutates every module of the credit path against the tests that cover it: too long for a
# 2-core box); this script mutates MODULE only, against TEST_FILEs only (default: the [mutmut] test selection),
# in a scratch copy of the tracked files (as they are in the working tree), which it leaves alone, so modules
# can run one after another or on different machines. It prints the summary and writes
# benchmarks/results/mutation_<module>[_<LABEL>].json: the counts, the score (killed and timed-out over killed,
# timed-out and survived), and each survivor's changed lines (`mutmut show`).
# That file is a working file: benchmarks/results/mutation.md is the committed record (each module's score and
# every equivalent survivor with its reason), updated by hand from a run.
set -euo pipefail
module=${1:?usage: benchmarks/mutation.sh MODULE [TEST_FILE ...]}
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$repo"
git ls-files -z | xargs -0 cp -a --parents -t "$scratch"
cd "$scratch"
tests=("$@")
python - "$module" "${tests[@]}" <<'EOF'
import configparser, sys
module, tests = sys.argv[1], sys.argv[2:]
config = configparser.ConfigParser()
config.read("setup.cfg")
config["mutmut"]["only_mutate"] = module
if tests:
    config["mutmut"]["pytest_add_cli_args_test_selection"] = "\n".join(tests)
with open("setup.cfg", "w") as handle:
    config.write(handle)
EOF
unset PYTHONPATH  # mutmut puts its mutated copy first on sys.path
survivors=()
if [[ -n "${SURVIVORS_OF:-}" ]]; then
  mapfile -t survivors < <(python -c 'import json, sys; print("\n".join(json.load(open(sys.argv[1]))["survivors"]))' "$repo/$SURVIVORS_OF")
fi
${MUTMUT_SECONDS:+timeout $MUTMUT_SECONDS} nice mutmut run --max-children "${MUTMUT_CHILDREN:-1}" "${survivors[@]}" > run.log 2>&1 || { tail -c 3000 run.log; true; }
tail -c 300 run.log | tr '\r' '\n' | tail -2
mutmut results --all true > results.txt || true
name=$(basename "$module" .py)${LABEL:+_$LABEL}
python - "$module" "$repo/benchmarks/results/mutation_${name}.json" "${SURVIVORS_OF:+$repo/$SURVIVORS_OF}" "${tests[@]}" <<'EOF'
import collections, json, subprocess, sys
module, out, earlier, tests = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
status = {}
for line in open("results.txt"):
    if ":" in line:
        name, result = line.rsplit(":", 1)
        status[name.strip()] = result.strip()
if earlier:  # only the earlier survivors ran; the rest keep the earlier result
    before = json.load(open(earlier))
    status = {name: result for name, result in status.items() if name in before["survivors"]}
counts = collections.Counter(status.values())
if earlier:
    for result, n in before["counts"].items():
        if result != "survived":
            counts[result] += n
killed = counts.get("killed", 0) + counts.get("timeout", 0)  # a mutant that hangs the tests is detected
survived = counts.get("survived", 0)
report = {
    "module": module,
    "tests": tests or "setup.cfg [mutmut] pytest_add_cli_args_test_selection",
    "counts": dict(counts),
    "score": killed / max(killed + survived, 1),
    "survivors": {
        name: subprocess.run(["mutmut", "show", name], capture_output=True, text=True).stdout.strip().splitlines()[-4:]
        for name, result in sorted(status.items())
        if result == "survived"
    },
}
with open(out, "w") as handle:
    json.dump(report, handle, indent=2)
print(json.dumps({k: report[k] for k in ("module", "counts", "score")}))
EOF

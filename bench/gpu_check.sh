#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU and torch (CUDA build) and/or CuPy,
# run the tests that use the GPU backends (the xp fixture adds torch-cuda and cupy
# when a GPU is present), the demo, host-sync counts per solve, the comparison with
# DASH's solvers (8 × 384², compiled too, and 16 × 1024² eager: the fixed-step solve
# with either verdict against DASH), and the solver and optimizer benchmarks; write everything under one
# folder, in under 10 minutes (a short lease: GPU_CHECK_BUDGET_S, later steps skipped).
#
#   bench/gpu_check.sh [--dry-run] OUT_DIR        (or OUT=OUT_DIR bench/gpu_check.sh)
#
# --dry-run runs on a CPU: the same steps, CPU-sized (test collection instead of the
# suite, the quick demo, the smallest benchmark presets), to check the script itself.
#
# Every step runs under `timeout`, its exit code and time are recorded, and
# OUT_DIR/summary.tsv and summary.json are written even when a step fails or the
# script is interrupted. Exit code: 0 if every step passed, 1 if any failed, 2 for
# bad usage or (without --dry-run) no GPU.
#
# Environment: PYTHON (default python), GPU_CHECK_BUDGET_S (total seconds, default
# 560), GPU_CHECK_CAP_SCALE (multiplies every step's time cap, default 1: a busy
# machine's dry run can raise it), GPU_CHECK_SOLVERS_ARGS / GPU_CHECK_OPTIM_ARGS
# (override the benchmark options), GPU_CHECK_INFO_ARGS / GPU_CHECK_DEMO_ARGS (added
# to `matroot info` and `matroot demo`, e.g. --backend numpy), GPU_CHECK_WORKERS
# (pytest-xdist workers for the tests, default 4).

set -u

dry_run=0
out=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option $arg" >&2; exit 2 ;;
    *) out="$arg" ;;
  esac
done
out="${out:-${OUT:-}}"
if [ -z "$out" ]; then
  echo "gpu_check.sh: give an output folder: bench/gpu_check.sh [--dry-run] OUT_DIR" >&2
  exit 2
fi
mkdir -p "$out" || exit 2
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.." || exit 2

PYTHON="${PYTHON:-python}"
budget="${GPU_CHECK_BUDGET_S:-560}"
cap_scale="${GPU_CHECK_CAP_SCALE:-1}"
start_s=$(date +%s)
deadline=$((start_s + budget))
export MATROOT_GPU_CHECK_RUNNING=1   # the suite's own test of this script skips itself
export PYTHONUNBUFFERED=1

summary_tsv="$out/summary.tsv"
printf 'step\tstatus\trc\tseconds\tlog\tcommand\n' > "$summary_tsv"
failed=0

write_summary_json() {
  "$PYTHON" - "$summary_tsv" "$out/summary.json" "$dry_run" "$start_s" <<'EOF' || true
import csv, json, sys, time
rows = list(csv.DictReader(open(sys.argv[1], newline=""), delimiter="\t"))
for row in rows:
    row["rc"] = int(row["rc"]) if row["rc"].lstrip("-").isdigit() else None
    row["seconds"] = int(row["seconds"])
json.dump({"dry_run": sys.argv[3] == "1", "started": int(sys.argv[4]),
           "seconds": int(time.time()) - int(sys.argv[4]), "steps": rows,
           "passed": all(r["status"] == "ok" for r in rows)},
          open(sys.argv[2], "w"), indent=2)
EOF
}
trap 'write_summary_json' EXIT
trap 'echo "gpu_check.sh: interrupted" >&2; exit 1' INT TERM

# step NAME CAP_SECONDS COMMAND...: run under timeout, log to OUT/NAME.log, record it.
step() {
  local name="$1" cap=$(( $2 * cap_scale )); shift 2
  local now left limit rc status t0 log="$out/$name.log"
  now=$(date +%s); left=$((deadline - now))
  limit=$(( cap < left ? cap : left ))
  if [ "$limit" -lt 5 ]; then
    printf '%s\tskipped\t-\t0\t-\t%s\n' "$name" "$*" >> "$summary_tsv"
    echo "== $name: skipped, the ${budget}s budget is spent"
    failed=1
    return
  fi
  echo "== $name (limit ${limit}s): $*"
  t0=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$log" 2>&1
  rc=$?
  case "$rc" in
    0) status=ok ;;
    124|137) status=timeout; failed=1 ;;
    *) status=failed; failed=1 ;;
  esac
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$(( $(date +%s) - t0 ))" \
    "$(basename "$log")" "$*" >> "$summary_tsv"
  echo "   $status (rc $rc, $(( $(date +%s) - t0 ))s); last lines of $log:"
  tail -n 3 "$log" | sed 's/^/   | /'
}

has_gpu() {
  nvidia-smi -L > /dev/null 2>&1 && return 0
  "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    > /dev/null 2>&1
}

if [ "$dry_run" = 0 ] && ! has_gpu; then
  echo "gpu_check.sh: no NVIDIA GPU visible (nvidia-smi and torch.cuda both say no);" \
       "use --dry-run to check the script on a CPU" >&2
  printf 'gpu\tfailed\t2\t0\t-\tnvidia-smi -L\n' >> "$summary_tsv"
  exit 2
fi

mkdir -p "$out/bench-optim"
if [ "$dry_run" = 1 ]; then
  solvers_args="${GPU_CHECK_SOLVERS_ARGS:---smoke --out $out/bench-solvers}"
  optim_args="${GPU_CHECK_OPTIM_ARGS:---quick --steps 1 --warmup 1 --out $out/bench-optim/optim.json}"
  step environment 30 bash -c "uname -a; $PYTHON --version; nproc; nvidia-smi || true"
  # shellcheck disable=SC2086
  step info 60 "$PYTHON" -m matroot info --save "$out/info.json" ${GPU_CHECK_INFO_ARGS:-}
  step tests 120 "$PYTHON" -m pytest --collect-only -q -p no:cacheprovider
  # shellcheck disable=SC2086
  step demo 90 "$PYTHON" -m matroot demo --quick --out "$out/demo.png" \
    --json "$out/demo.json" ${GPU_CHECK_DEMO_ARGS:-}
  # shellcheck disable=SC2086  # the options are a word list on purpose
  step bench-solvers 120 "$PYTHON" -m bench solvers $solvers_args
  # shellcheck disable=SC2086
  step bench-optim 120 "$PYTHON" -m bench optim $optim_args
else
  solvers_args="${GPU_CHECK_SOLVERS_ARGS:---quick --backends torch-cuda cupy --out $out/bench-solvers}"
  optim_args="${GPU_CHECK_OPTIM_ARGS:---backend torch-cuda --out $out/bench-optim/optim.json}"
  # Steps run most telling first: a short lease spends its time where it counts.
  # The float32 product settings decide what cuSOLVER's and cuBLAS's float32 errors are.
  step environment 30 bash -c "uname -a; $PYTHON --version; nproc; nvidia-smi; \
    env | grep -i -E 'tf32|matmul' || true; $PYTHON -c 'import torch; \
    print(\"allow_tf32\", torch.backends.cuda.matmul.allow_tf32, \
          torch.get_float32_matmul_precision())' || true"
  # Time to 5e-3 against DASH's own solvers on the GPU, eager and compiled (CUDA
  # graphs; skipped without its wheel). Compilations take most of the step.
  step dash 240 "$PYTHON" -m bench dash_reference --device cuda --compile --goals 5e-3 \
    --out "$out/dash"
  # The eager solve (fixed steps, host and device verdict; adaptive) against DASH at
  # the larger size of issue 35's goal, 16 × 1024², κ = 1e4 (no compile: eager only).
  step dash-1024 150 "$PYTHON" -m bench dash_reference --device cuda --goals 5e-3 \
    --n 1024 --batch 16 --kappas 1e4 --out "$out/dash-1024"
  # The tests on the GPU backends (torch-cuda, cupy), quick tier: the CPU backends'
  # tests run on every CI machine already. JAX on the GPU compiles every shape for
  # seconds, so it gets a step of its own on the files that judge `converged`.
  step tests 150 "$PYTHON" -m pytest -q -rs -m "not slow" -k "(cuda or cupy) and not jax" \
    -n "${GPU_CHECK_WORKERS:-4}" -p no:cacheprovider --junitxml="$out/pytest.xml"
  # (Every jax-cuda test is in the slow tier, so no -m "not slow" here.)
  step tests-jax-gpu 90 "$PYTHON" -m pytest -q -rs -k "jax-cuda" \
    -n "${GPU_CHECK_WORKERS:-4}" -p no:cacheprovider tests/solvers/test_evd.py \
    tests/accuracy/test_converged_means_right.py
  # shellcheck disable=SC2086
  step info 120 "$PYTHON" -m matroot info --save "$out/info.json" ${GPU_CHECK_INFO_ARGS:-}
  # shellcheck disable=SC2086
  step demo 40 "$PYTHON" -m matroot demo --out "$out/demo.png" --json "$out/demo.json" \
    ${GPU_CHECK_DEMO_ARGS:-}
  # Host<->device syncs per solve, per method (the design allows only batched checks).
  step syncs 60 "$PYTHON" -m bench gpu_syncs --out "$out/syncs.json"
  # shellcheck disable=SC2086
  step bench-optim 60 "$PYTHON" -m bench optim $optim_args
  # shellcheck disable=SC2086
  step bench-solvers 60 "$PYTHON" -m bench solvers $solvers_args
fi

echo
column -t -s "$(printf '\t')" "$summary_tsv" 2> /dev/null | cut -c1-100 || cat "$summary_tsv"
echo "results in $out ($(( $(date +%s) - start_s ))s)"
exit "$failed"

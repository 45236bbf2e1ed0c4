#!/usr/bin/env bash
# Rerun every benchmark of bench/ at this checkout, one after another; each writes its record
# (bench/records.py: commit, machine, load before and after, figures, and the reference measured
# in the same invocation) and the run ends by checking every record against its bench's schema.
#
#   bash bench/run_all.sh                  # every bench at the scales of bench/README.md's table
#   bash bench/run_all.sh --smoke          # every bench at a tiny scale (seconds each), records in a
#                                          # temporary directory: checks that each runs and writes a
#                                          # well-formed record (CI's bench tier), figures meaningless
#   bash bench/run_all.sh --with-soak      # and the 30-minute soak
#   bash bench/run_all.sh --with-real-node # and real_node_creates (root, Docker)
#   bash bench/run_all.sh --only a,b       # only these benches (names as in bench/results/)
#   AGAINST=REF bash bench/run_all.sh      # the tree the --against benches compare with (default HEAD~1)
#   OUT=/some/dir bash bench/run_all.sh    # where each bench's output goes (default: a dated directory in /tmp)
#
# Records go to bench/results/ (smoke: $OUT/records); $GPU_ADMISSION_BENCH_RESULTS moves them.
# Run from anywhere; needs the virtualenv (.venv, `pip install -e '.[test]'`) and Go (the load
# generator, OPA and the local control plane are built into ~/.cache/gpu-admission on first use).
# Scripts never run at once: they share the machine's cores. The records carry the load average
# before and after, so a run on a busy machine says so. After a full run:
#   .venv/bin/python -m docs.generate && .venv/bin/python bench/plot.py
set -euo pipefail

cd "$(dirname "$0")/.."
PY=.venv/bin/python
STAMP=$(date -u +%Y%m%dT%H%MZ)
OUT=${OUT:-/tmp/gpu-admission-bench-$STAMP}
mkdir -p "$OUT"

smoke=0 soak=0 real_node=0 only=""
while (($#)); do
  case "$1" in
    --smoke) smoke=1 ;;
    --with-soak) soak=1 ;;
    --with-real-node) real_node=1 ;;
    --only) only=${2:?--only needs a comma list}; shift ;;
    *) echo "usage: $0 [--smoke] [--with-soak] [--with-real-node] [--only a,b]" >&2; exit 2 ;;
  esac
  shift
done

if [ "$smoke" = 1 ]; then
  export GPU_ADMISSION_BENCH_RESULTS=${GPU_ADMISSION_BENCH_RESULTS:-$OUT/records}
  soak=1  # a few seconds of it
fi
RESULTS=${GPU_ADMISSION_BENCH_RESULTS:-bench/results}
AGAINST=${AGAINST:-HEAD~1}
AGAINST_COMMIT=$(git rev-parse --short "$AGAINST")
# The benches that take a source directory as their reference get the tracked files of AGAINST.
AGAINST_DIR="$OUT/against-$AGAINST_COMMIT"
if [ ! -d "$AGAINST_DIR" ]; then
  mkdir -p "$AGAINST_DIR"
  git archive "$AGAINST_COMMIT" | tar -x -C "$AGAINST_DIR"
fi

# cel_candidates compares the adopted CEL library with the others, which no extra installs.
if [ -z "$only" ] || [[ ",$only," == *",cel_candidates,"* ]]; then
  $PY -c 'import cel, celpy' 2>/dev/null || $PY -m pip install -q cel-python common-expression-language
fi

status=0
ran=()
run() {
  local name=$1; shift
  if [ -n "$only" ] && [[ ",$only," != *",$name,"* ]]; then
    return 0
  fi
  ran+=("$name")
  echo "== $name: $* (load $(cut -d' ' -f1 /proc/loadavg))" | tee -a "$OUT/index.txt"
  local started=$SECONDS
  if "$@" >"$OUT/$name.txt" 2>"$OUT/$name.err"; then
    echo "   ok in $((SECONDS - started)) s -> $OUT/$name.txt" | tee -a "$OUT/index.txt"
  else
    echo "   FAILED ($?) in $((SECONDS - started)) s; see $OUT/$name.err" | tee -a "$OUT/index.txt"
    tail -n 5 "$OUT/$name.err" | sed 's/^/   | /'
    status=1
  fi
}

{
  echo "machine: $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "against: $AGAINST ($AGAINST_COMMIT); records: $RESULTS; $([ "$smoke" = 1 ] && echo smoke || echo full) run"
} | tee "$OUT/index.txt"

if [ "$smoke" = 1 ]; then
  # Tiny: each bench runs its whole path (servers, control plane, reference, record) in seconds.
  run webhook_load        $PY bench/webhook_load.py --against "$AGAINST_COMMIT" --rounds 1 --concurrency 4 --duration 0.5 --warmup 0.2
  run compare_opa         $PY bench/compare_opa.py --servers ours,opa --bodies small --rounds 1 --duration 0.5 --warmup 0.2 --rates 20
  run e2e_pod_creates     $PY bench/e2e_pod_creates.py --pods cpu --rounds 1 --duration 0.5 --warmup 0.2 --rates 20
  run dryrun_throughput   $PY bench/dryrun_throughput.py --objects 100 --repeat 1
  run policies_inprocess  $PY bench/policies_inprocess.py --against "$AGAINST_COMMIT" --rounds 1 --repeat 1 --evaluations 10 --copies 2
  run replica_stream      $PY bench/replica_stream.py --deployments 4 --jobs 2 --statefulsets 1 --daemonsets 1 --nodes 3 --bare 10 --namespaces 2 --sizes 64 --rounds 1
  run cel_candidates      $PY bench/cel_candidates.py --rounds 2
  run explain_scale       $PY bench/explain_scale.py --nodes 10 --pods 20 --repeat 1
  run extender_cpu        $PY bench/extender_cpu.py --nodes 20 --percentage 100 --pods 10 --rounds 1 --warmup 5 --against "$AGAINST_DIR"
  run extender_throughput $PY bench/extender_throughput.py --nodes 5 --pods 20 --rounds 1 --idle 0 --budgets
  run audit_inprocess     $PY bench/audit_inprocess.py --against "$AGAINST_DIR" --pods 200 --nodes 20 --rounds 1
  run audit_throughput    $PY bench/audit_throughput.py --pods 40 --nodes 8 --repeat 1 --against "$AGAINST_DIR"
  run labeler_usage       $PY bench/labeler_usage.py interval --passes 5 --processes 3
  run labeler_usage_churn $PY bench/labeler_usage.py churn --nodes 10 --minutes 2 --warmup 1
  run usage_writes_kwok   $PY bench/usage_writes_kwok.py --nodes 5 --minutes 1 --warmup 1 --settle 1 --models default-60s
  run preemption          $PY bench/preemption.py --nodes 2 --preemptors 1 --timeout 15 --batch 50
  run fuzz_long           $PY bench/fuzz_long.py --minutes 0.1
  run soak                $PY bench/soak.py --minutes 1 --segment-seconds 5 --warmup-minutes 0 --rate 20
else
  # About 45 minutes on 2 cores: scales that let one run of every bench fit in one sitting; each
  # script's own defaults and bench/README.md's commands go further.
  run webhook_load        $PY bench/webhook_load.py --against "$AGAINST_COMMIT" --rounds 3 --duration 3 --warmup 1
  run compare_opa         $PY bench/compare_opa.py --servers ours,opa --bodies small --rounds 1 --duration 5 --json "$OUT/compare_opa.json"
  run e2e_pod_creates     $PY bench/e2e_pod_creates.py --pods cpu --rounds 2 --duration 5 --json "$OUT/e2e_pod_creates.json"
  run dryrun_throughput   $PY bench/dryrun_throughput.py --objects 5000 --repeat 3
  run policies_inprocess  $PY bench/policies_inprocess.py --against "$AGAINST_COMMIT" --rounds 4 --repeat 3
  run replica_stream      $PY bench/replica_stream.py
  run cel_candidates      $PY bench/cel_candidates.py --rounds 10
  run explain_scale       $PY bench/explain_scale.py --nodes 500 --pods 1000
  run extender_cpu        $PY bench/extender_cpu.py --nodes 5000 --percentage 100 --pods 300 --rounds 3 --against "$AGAINST_DIR"
  run extender_throughput $PY bench/extender_throughput.py --nodes 500 --pods 1000 --rounds 2 --budgets
  run extender_throughput_5000 $PY bench/extender_throughput.py --nodes 5000 --pods 500 --rounds 1
  run audit_inprocess     $PY bench/audit_inprocess.py --against "$AGAINST_DIR" --pods 30000 --rounds 3
  run audit_throughput    $PY bench/audit_throughput.py --pods 10000 --nodes 500 --repeat 1 --against "$AGAINST_DIR"
  run labeler_usage       $PY bench/labeler_usage.py interval --passes 200
  run labeler_usage_churn $PY bench/labeler_usage.py churn
  run usage_writes_kwok   $PY bench/usage_writes_kwok.py --nodes 500 --minutes 10 --models default-60s
  run preemption          $PY bench/preemption.py --nodes 200 --preemptors 10 --timeout 60
  run fuzz_long           $PY bench/fuzz_long.py --minutes 3
  if [ "$soak" = 1 ]; then
    run soak              $PY bench/soak.py --minutes 30 --rate 200 --json "$OUT/soak.json"
  fi
fi
if [ "$real_node" = 1 ]; then
  run real_node_creates   $PY bench/real_node_creates.py --image gpu-admission:0.1.0
fi

# Every bench that ran must have written a record of this commit that matches its schema.
if ((${#ran[@]})); then
  if ! $PY bench/records.py check --results "$RESULTS" --commit "$(git rev-parse --short HEAD)" "${ran[@]}" | tee -a "$OUT/index.txt"; then
    status=1
  fi
fi
echo "output in $OUT; records in $RESULTS" | tee -a "$OUT/index.txt"
exit $status

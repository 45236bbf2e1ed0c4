#!/usr/bin/env bash
# Rerun every benchmark of bench/ and collect its output in one directory, one file per script.
#
#   bash bench/run_all.sh                 # everything but the 30-minute soak (about 30-40 minutes)
#   bash bench/run_all.sh --with-soak     # and the soak (30 minutes more)
#   bash bench/run_all.sh --quick         # short durations: checks the scripts run, figures are rough
#   OUT=/some/dir bash bench/run_all.sh   # where the results go (default: a dated directory in /tmp)
#
# Run from anywhere; needs the virtualenv (.venv, `pip install -e '.[test]'`) and Go (the load
# generator, OPA and the local control plane are built into ~/.cache/gpu-admission on first use).
# Scripts run one after another, never at once: they share the machine's cores. The figures in
# bench/README.md name the machine, the command and the date; copy new ones there by hand.
set -euo pipefail

cd "$(dirname "$0")/.."
PY=.venv/bin/python
STAMP=$(date -u +%Y%m%dT%H%MZ)
OUT=${OUT:-/tmp/gpu-admission-bench-$STAMP}
mkdir -p "$OUT"

soak=0
quick=0
for arg in "$@"; do
  case "$arg" in
    --with-soak) soak=1 ;;
    --quick) quick=1 ;;
    *) echo "usage: $0 [--with-soak] [--quick]" >&2; exit 2 ;;
  esac
done

if [ "$quick" = 1 ]; then
  D=3; FUZZ_MIN=1; SOAK_MIN=3; PODS=1000; NODES=50; EXT_PODS=200; DRY=1000
else
  D=10; FUZZ_MIN=10; SOAK_MIN=30; PODS=10000; NODES=500; EXT_PODS=1000; DRY=5000
fi

status=0
run() {
  local name=$1; shift
  echo "== $name: $* (load $(cut -d' ' -f1 /proc/loadavg))" | tee -a "$OUT/index.txt"
  local started=$SECONDS
  if "$@" >"$OUT/$name.txt" 2>"$OUT/$name.err"; then
    echo "   ok in $((SECONDS - started)) s -> $OUT/$name.txt" | tee -a "$OUT/index.txt"
  else
    echo "   FAILED ($?) in $((SECONDS - started)) s; see $OUT/$name.err" | tee -a "$OUT/index.txt"
    status=1
  fi
}

{
  echo "machine: $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
} | tee "$OUT/index.txt"

run webhook_load        $PY bench/webhook_load.py --concurrency 16 --duration "$D" --warmup 2
run compare_opa         $PY bench/compare_opa.py --servers ours1,ours13p,ours,ours23p,opa --duration "$D" --json "$OUT/compare_opa.json"
run e2e_pod_creates     $PY bench/e2e_pod_creates.py --duration "$D" --json "$OUT/e2e_pod_creates.json"
run dryrun_throughput   $PY bench/dryrun_throughput.py --objects "$DRY"
run extender_throughput $PY bench/extender_throughput.py --nodes "$NODES" --pods "$EXT_PODS" --rounds 2
run audit_throughput    $PY bench/audit_throughput.py --pods "$PODS"
run fuzz_long           $PY bench/fuzz_long.py --minutes "$FUZZ_MIN"
if [ "$soak" = 1 ]; then
  run soak              $PY bench/soak.py --minutes "$SOAK_MIN" --rate 200 --json "$OUT/soak.json"
fi

echo "results in $OUT" | tee -a "$OUT/index.txt"
exit $status

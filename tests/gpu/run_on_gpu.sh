#!/usr/bin/env bash
# The labeler against real NVML on a GPU machine; everything it saw is saved under $OUT.
#
#   OUT=/some/dir bash tests/gpu/run_on_gpu.sh
#
# Needs only python3 (3.11+) with nvidia-ml-py and PyYAML, which the device machine's image has:
# nothing is installed and no cluster is touched. Runs `gpu-admission labeler --once --dry-run -o json`
# (the console script when it is installed and has `labeler`, else the module entry point) and the
# real-NVML tests under tests/gpu. Files under $OUT (at most 7):
#   labels.json         the dry-run JSON (labels, annotations, capacity per mode)
#   labeler.stderr      the labeler's log; one line on "no NVML"
#   nvidia-smi.csv      index, uuid, name, memory.total, driver of every card, to compare with labels.json
#   nvidia-smi-topo.txt `nvidia-smi topo -m`, to compare with the gpu-topology annotation
#   pytest.log          the tests/gpu run
#   summary.txt         exit statuses and versions
# The exit status is the labeler's (0 labels printed, 3 no NVML, 1 a read error), or pytest's if that failed.
set -uo pipefail
: "${OUT:?set OUT to a directory for the results}"
cd "$(dirname "$0")/../.." || exit 2
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# On the GPU machine a missing driver, nvidia-smi or libcuda is a failure, not a skip.
export GPU_ADMISSION_NVML=${GPU_ADMISSION_NVML:-require}

if command -v gpu-admission >/dev/null 2>&1 && gpu-admission labeler --help >/dev/null 2>&1; then
  labeler=(gpu-admission labeler)
else
  labeler=("$PYTHON" -m webhook.labeler.cli labeler)
fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "python: $("$PYTHON" --version 2>&1)"
  echo "nvidia-ml-py: $("$PYTHON" -c 'import importlib.metadata as m; print(m.version("nvidia-ml-py"))' 2>&1)"
  echo "labeler: ${labeler[*]}"
} >"$OUT/summary.txt"

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version --format=csv >"$OUT/nvidia-smi.csv" 2>&1
  nvidia-smi topo -m >"$OUT/nvidia-smi-topo.txt" 2>&1
else
  echo "nvidia-smi: not installed" >>"$OUT/summary.txt"
fi

"${labeler[@]}" --once --dry-run -o json --node-name "$(hostname)" >"$OUT/labels.json" 2>"$OUT/labeler.stderr"
labeler_status=$?
echo "labeler exit: $labeler_status" >>"$OUT/summary.txt"

# --confcutdir keeps the repository's top-level conftest (TLS fixtures, aiohttp, cryptography) out:
# these tests need none of it, and the device image lacks some of those packages.
"$PYTHON" -m pytest tests/gpu -v -rs --confcutdir=tests/gpu -p no:cacheprovider -o addopts="" >"$OUT/pytest.log" 2>&1
pytest_status=$?
echo "pytest exit: $pytest_status" >>"$OUT/summary.txt"

cat "$OUT/summary.txt" "$OUT/labeler.stderr"
tail -n 15 "$OUT/pytest.log"
if [ "$pytest_status" -ne 0 ] && [ "$pytest_status" -ne 5 ]; then
  exit "$pytest_status"
fi
exit "$labeler_status"

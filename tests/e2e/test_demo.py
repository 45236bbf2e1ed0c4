"""The README's main command, `gpu-admission demo`, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

CLI = str(Path(sys.executable).with_name("gpu-admission"))
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_demo_admits_the_seed_workloads_refuses_every_bypass_and_shows_placement(bin_dir: Path, tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    try:
        completed = subprocess.run(
            [CLI, "demo", "--dir", str(directory)], capture_output=True, text=True, timeout=300, check=False
        )
    finally:
        subprocess.run([CLI, "cluster", "down", "--dir", str(directory)], capture_output=True, check=False, timeout=120)
    out = completed.stdout
    assert completed.returncode == 0, out + completed.stderr
    assert out.strip().endswith("demo: every workload admitted and every bypass refused")
    for seed in ("tf-notebook", "not-in-gpu-node", "cgpu-test.yaml", "cgpu-test-no-isolation", "tensorflow-mnist"):
        assert any(line.strip().startswith("admitted") and seed in line for line in out.splitlines()), seed
    bypasses = sorted((EXAMPLES / "bypasses").glob("*.yaml"))
    assert len(bypasses) >= 8, bypasses
    for path in bypasses:
        # Refused by the webhook, naming the policy the example's file name says (gpu003-... -> GPU003:).
        policy = path.name.split("-", 1)[0].upper()
        assert any(line.strip().startswith(f"REFUSED   {path.name}: ") and f"{policy}:" in line for line in out.splitlines()), (
            f"{path.name} not refused by {policy}:\n{out}"
        )
    assert "FAILED" not in out
    placement = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("   ") and " Running " in line}
    assert placement["not-in-gpu-node"][2] == "cpu-0"
    assert placement["cgpu-test-0"][3] == "cgpu"
    assert placement["cgpu-test-no-isolation-0"][3] == "share"
    assert next(row for name, row in placement.items() if name.startswith("tf-notebook"))[4] == "Tesla-M40"
    assert f"export KUBECONFIG={directory.resolve() / 'kubeconfig'}" in out
    assert f"gpu-admission cluster down --dir {directory}" in out

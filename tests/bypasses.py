"""The shipped bypass examples (`examples/bypasses/`) and the exported ValidatingAdmissionPolicy that refuses each."""

from __future__ import annotations

REFUSED_BY_POLICY: list[tuple[str, str]] = [
    ("gpu001-visible-devices-env.yaml", "gpu-admission-gpu001"),
    ("gpu002-privileged-gpu.yaml", "gpu-admission-gpu002"),
    ("gpu003-host-path-devices.yaml", "gpu-admission-gpu003"),
    ("gpu004-malformed-resources.yaml", "gpu-admission-gpu004"),
]

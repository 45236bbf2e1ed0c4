"""Container resources that unit and end-to-end tests build alike."""

from __future__ import annotations


def gpu_limits(*, mem: int | str | None = None, core: int | None = None, whole: int | None = None) -> dict[str, str]:
    """A container's GPU limits: `aliyun.com/gpu-mem` (GiB), `aliyun.com/gpu-core.percentage` and
    `aliyun.com/gpu` (whole cards), in that order; None leaves one out."""
    named = {"aliyun.com/gpu-mem": mem, "aliyun.com/gpu-core.percentage": core, "aliyun.com/gpu": whole}
    return {key: str(value) for key, value in named.items() if value is not None}

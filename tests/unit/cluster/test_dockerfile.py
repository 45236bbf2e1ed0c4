"""The Dockerfile: its base is a build argument (the official Python image by default), the final
image runs as a numeric non-root user, and the CA bundle for pip reaches only the one RUN that
installs, as a BuildKit secret: never a layer, an ENV, an ARG or the history."""

from __future__ import annotations

import re
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[3] / "Dockerfile"


def instructions() -> list[str]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_base_is_a_build_argument_defaulting_to_the_official_python_image() -> None:
    lines = instructions()
    first_from = next(i for i, line in enumerate(lines) if line.startswith("FROM "))
    assert "ARG BASE=python:3.11-slim" in lines[:first_from]
    assert [line.split()[1] for line in lines if line.startswith("FROM ")] == ["${BASE}", "${BASE}"]


def test_the_final_image_runs_as_a_numeric_non_root_user_with_an_absolute_entrypoint() -> None:
    lines = instructions()
    final = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM ")) :]
    [user] = [line for line in final if line.startswith("USER ")]
    uid, gid = user.split()[1].split(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit()
    [entrypoint] = [line for line in final if line.startswith("ENTRYPOINT ")]
    assert '"/opt/gpu-admission/bin/gpu-admission"' in entrypoint
    assert not any(line.startswith(("RUN pip", "COPY . ")) for line in final), "no source tree or installer in the final stage"


def test_the_ca_bundle_is_only_a_secret_mount_of_the_install_step() -> None:
    lines = instructions()
    mentions = [line for line in lines if re.search(r"\bca\b|PIP_CERT|\.crt|certificates", line)]
    assert len(mentions) == 1 and mentions[0].startswith("RUN --mount=type=secret,id=ca,required=false")
    assert not any(line.startswith(("ENV ", "ARG ")) and "CERT" in line.upper() for line in lines)

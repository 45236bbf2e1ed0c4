"""The krew manifest of `kubectl inspect-cgpu`: krew's own validation rules (kubernetes-sigs/krew,
internal/index/validation/validate.go) and its naming rules, checked field by field."""

from __future__ import annotations

import pathlib
import re
import tomllib
from typing import Any

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
MANIFEST = REPO / "deploy" / "krew" / "inspect-cgpu.yaml"
SAFE_NAME = re.compile(r"^[\w-]+$")  # krew's safePluginRegexp
SHA256 = re.compile(r"^[a-f0-9]{64}$")
SEMVER = re.compile(r"^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")  # krew wants the v


def _manifest() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    return loaded


def krew_problems(name: str, plugin: dict[str, Any]) -> list[str]:
    """What krew's ValidatePlugin would refuse, in its order (empty: valid)."""
    problems = []
    if plugin.get("apiVersion") != "krew.googlecontainertools.github.com/v1alpha2":
        problems.append("apiVersion")
    if plugin.get("kind") != "Plugin":
        problems.append("kind")
    if not SAFE_NAME.match(name) or name.upper() in {"CON", "PRN", "AUX", "NUL"}:
        problems.append("unsafe name")
    if plugin.get("metadata", {}).get("name") != name:
        problems.append("metadata.name differs from the file name")
    spec = plugin.get("spec", {})
    short = spec.get("shortDescription", "")
    if not short or "\n" in short or "\r" in short:
        problems.append("shortDescription")
    if not SEMVER.match(str(spec.get("version", ""))):
        problems.append("version")
    platforms = spec.get("platforms") or []
    if not platforms:
        problems.append("platforms")
    for platform in platforms:
        if not platform.get("uri") or not SHA256.match(str(platform.get("sha256", ""))) or not platform.get("bin"):
            problems.append("uri/sha256/bin")
        files = platform.get("files")
        if files is not None and (not files or any(not f.get("from") or not f.get("to") for f in files)):
            problems.append("files")
        labels = (platform.get("selector") or {}).get("matchLabels") or {}
        if not labels or set(labels) - {"os", "arch"}:
            problems.append("selector")
    return problems


def test_the_manifest_passes_krews_validation() -> None:
    assert krew_problems(MANIFEST.stem, _manifest()) == []


def test_the_checker_refuses_what_krew_refuses() -> None:
    good = _manifest()
    assert krew_problems("inspect-cgpu", {**good, "kind": "Other"}) == ["kind"]
    assert krew_problems("inspect cgpu", good) == ["unsafe name", "metadata.name differs from the file name"]
    assert krew_problems("inspect-cgpu", {**good, "spec": {**good["spec"], "version": "0.1.0"}}) == ["version"]
    bad_platform = {**good["spec"]["platforms"][0], "selector": {"matchLabels": {"os": "linux", "distro": "x"}}}
    assert krew_problems("inspect-cgpu", {**good, "spec": {**good["spec"], "platforms": [bad_platform]}}) == ["selector"]


def test_the_name_follows_krews_naming_guide_and_maps_to_the_underscore_binary() -> None:
    name = _manifest()["metadata"]["name"]
    assert name == name.lower() and "_" not in name  # kebab-case, as the naming guide asks
    binary = "kubectl-" + name.replace("-", "_")  # how krew links it (krew PR #60), run as `kubectl inspect-cgpu`
    assert binary == "kubectl-inspect_cgpu"
    assert {platform["bin"] for platform in _manifest()["spec"]["platforms"]} == {binary}


def test_the_version_is_the_projects_and_two_word_kubectl_inspect_cgpu_still_installs() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert _manifest()["spec"]["version"] == "v" + project["version"]
    # `kubectl inspect cgpu` (two words, the README's spelling) is the pip console script's doing
    assert project["scripts"]["kubectl-inspect-cgpu"] == "webhook.extender.cli:inspect_main"

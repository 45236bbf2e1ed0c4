"""The GPU model's import contract names every module of the policy machinery.

import-linter's forbidden contract lists what `policies.gpu` may not import; this test makes that
list an allowlist in effect: every module of `policies` outside the GPU model is forbidden to it,
except the pod-shape helpers it reads pods with (`podspec`, and `patching` under it). A module added
to `policies` later is caught here until it is named in the contract or moved into the model.
"""

from __future__ import annotations

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
POD_SHAPE = {"policies.podspec", "policies.patching"}
CONTRACT = "the GPU model (policies.gpu) imports nothing of the policy machinery"


def _contract() -> dict[str, object]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found = [c for c in config["tool"]["importlinter"]["contracts"] if c["name"] == CONTRACT]
    assert len(found) == 1
    contract: dict[str, object] = found[0]
    return contract


def _machinery() -> set[str]:
    """Every module and package directly under policies/, less the GPU model and the pod-shape helpers."""
    children = {
        f"policies.{path.stem if path.suffix == '.py' else path.name}"
        for path in (ROOT / "policies").iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()
    }
    assert {"policies.gpu", "policies.engine", "policies.builtin", "policies.podspec"} <= children
    return children - {"policies.gpu"} - POD_SHAPE


def test_the_gpu_model_contract_forbids_every_module_of_the_machinery() -> None:
    contract = _contract()
    assert contract["source_modules"] == ["policies.gpu"]
    forbidden = contract["forbidden_modules"]
    assert isinstance(forbidden, list)
    assert set(forbidden) == _machinery()


def test_the_gpu_model_holds_the_vocabulary_and_the_codecs() -> None:
    package = ROOT / "policies" / "gpu"
    modules = {path.stem for path in package.glob("*.py")}
    assert {"__init__", "allocation", "cards", "inventory", "reservations", "usage", "quantity", "dra"} <= modules

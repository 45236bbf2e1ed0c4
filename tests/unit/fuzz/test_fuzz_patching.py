"""patching.apply is all or nothing: the engine relies on it instead of copying the object per mutator."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from policies import patching
from tests.unit.fuzz import hostile
from tests.unit.fuzz.servers import FUZZ

_TOKENS = st.sampled_from(["metadata", "spec", "containers", "0", "1", "-", "env", "labels", "a~1b", "x", "5", "01"])
_PATHS = st.lists(_TOKENS, min_size=0, max_size=5).map(lambda tokens: "".join("/" + t for t in tokens))
_OPERATIONS = st.lists(
    st.fixed_dictionaries({"op": st.sampled_from(["add", "add", "add", "remove"]), "path": _PATHS, "value": hostile.JSON}),
    max_size=6,
)


@FUZZ
@given(operations=_OPERATIONS)
def test_apply_either_applies_every_operation_or_leaves_the_document_as_it_was(operations: list[dict[str, Any]]) -> None:
    document = patching.thaw(hostile.pod(env=[{"name": "A", "value": "1"}]))
    before = copy.deepcopy(document)
    try:
        patching.apply(document, operations)
    except patching.PatchError:
        assert document == before
        return
    except (KeyError, IndexError, TypeError, ValueError) as error:  # any failure must undo, whatever its type
        assert document == before, error
        return
    # Applied: doing it again on a fresh copy gives the same document, and JSON round-trips it.
    again = patching.thaw(before)
    patching.apply(again, operations)
    assert again == document
    assert json.loads(json.dumps(document)) == document


@FUZZ
@given(value=hostile.JSON)
def test_thaw_copies_every_container_and_keeps_equal_values(value: Any) -> None:
    thawed = patching.thaw(value)
    assert thawed == value

    def containers(node: Any) -> list[int]:
        found = [id(node)] if isinstance(node, (dict, list)) else []
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
        return found + [i for child in children for i in containers(child)]

    assert not set(containers(thawed)) & set(containers(value))

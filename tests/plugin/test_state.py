"""CycleState: typed reads and writes over one dict, and what a key nothing wrote reads as."""

from __future__ import annotations

from epp.plugin.keys import AttributeKey, StateKey
from epp.plugin.state import CycleState

LOAD = AttributeKey("test-load", int)
OTHER = AttributeKey("test-load", int)  # same name, another key: keys are equal only to themselves
PICKED = StateKey[str]("test-picked")


def test_unwritten_keys_read_as_empty_and_none_without_being_added() -> None:
    """A key no producer wrote: ``attributes`` is empty, ``attribute`` and ``get`` None, and
    reading leaves the state as empty as it was."""
    state = CycleState()
    assert state.attributes(LOAD) == {}
    assert state.attribute(LOAD, "ep") is None
    assert state.get(PICKED) is None
    assert len(state) == 0


def test_values_and_attributes_round_trip() -> None:
    """``put``/``get``, ``set_attributes``/``attributes`` and ``put_attribute``/``attribute``
    each read back what was written, and two keys of one name stay apart."""
    state = CycleState()
    state.put(PICKED, "a")
    state.set_attributes(LOAD, {"ep1": 1})
    state.put_attribute(LOAD, "ep2", 2)
    state.put_attribute(OTHER, "ep1", 9)
    assert state.get(PICKED) == "a"
    assert state.attributes(LOAD) == {"ep1": 1, "ep2": 2}
    assert state.attribute(LOAD, "ep2") == 2
    assert state.attribute(OTHER, "ep1") == 9
    assert state.attribute(OTHER, "ep2") is None

"""The node-list cache (``Cache.NODE_LIST``): kept while the node list stays the same."""

from __future__ import annotations

from sched_builders import WHOLE

from scheduler.cluster import shape_of
from scheduler.model import Node, Slice


def _nodes(gpus: int, *, schedulable: bool = True) -> tuple[Node, ...]:
    slices = tuple(Slice(f"n0-g{g}", "n0", f"g{g}", WHOLE, 1.0, "A100") for g in range(gpus))
    return (Node("n0", slices, schedulable), Node("n1", (), True))


def test_a_new_tuple_of_equal_nodes_gets_the_kept_shape() -> None:
    kept = shape_of(_nodes(4))
    assert shape_of(_nodes(4)) is kept  # new objects, equal values: the shell's every pass


def test_a_changed_node_list_gets_a_shape_of_its_own() -> None:
    four = shape_of(_nodes(4))
    two = shape_of(_nodes(2))
    assert two is not four
    assert two.total_units == 2.0
    drained = shape_of(_nodes(2, schedulable=False))
    assert drained.total_units == 0.0


def test_switched_off_the_shape_is_built_afresh_each_time() -> None:
    nodes = _nodes(3)
    built = shape_of(nodes, remember=False)
    assert shape_of(nodes, remember=False) is not built
    assert built.total_units == 3.0

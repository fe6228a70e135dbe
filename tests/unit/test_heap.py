import gc

from tritonforge.heap import freeze_startup_heap


class Node:
    other: "Node"


def test_frozen_start_up_objects_leave_full_passes_and_later_garbage_is_still_collected() -> None:
    tracked = len(gc.get_objects())
    gc.disable()  # no automatic pass between the counts below
    try:
        assert freeze_startup_heap() >= tracked // 2
        scanned = len(gc.get_objects())  # what a full pass walks now
        assert scanned < tracked // 10
        for _ in range(1000):  # cyclic garbage made after the freeze
            a, b = Node(), Node()
            a.other, b.other = b, a
        del a, b
        assert gc.collect() >= 2000
        assert len(gc.get_objects()) <= scanned + 50
    finally:
        gc.unfreeze()  # this test process goes on running other tests
        gc.enable()

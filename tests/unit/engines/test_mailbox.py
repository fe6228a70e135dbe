"""The mailbox between an engine and a request's consumer: order, waiting, wake-up,
and items handed to a function as they are put."""

from __future__ import annotations

import asyncio

import pytest

from tritonforge.engines.base import Mailbox


def test_items_come_out_in_order_whether_or_not_the_reader_waits() -> None:
    async def scenario() -> list[int]:
        box: Mailbox[int] = Mailbox()
        box.put(1)
        box.put(2)
        got = [await box.get(), await box.get()]
        reader = asyncio.ensure_future(box.get())
        await asyncio.sleep(0)
        assert not reader.done()  # nothing to read: it waits
        box.put(3)
        box.put(4)
        got += [await reader, await box.get()]
        return got

    assert asyncio.run(scenario()) == [1, 2, 3, 4]


def test_a_cancelled_reader_leaves_the_mailbox_usable() -> None:
    async def scenario() -> int:
        box: Mailbox[int] = Mailbox()
        reader = asyncio.ensure_future(box.get())
        await asyncio.sleep(0)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        box.put(7)  # the cancelled waiter is not woken twice, the item is kept
        return await asyncio.wait_for(box.get(), 1)

    assert asyncio.run(scenario()) == 7


def test_drain_hands_waiting_items_then_each_put_until_the_sink_declines() -> None:
    async def scenario() -> tuple[list[int], list[int], int]:
        box: Mailbox[int] = Mailbox()
        box.put(1)
        box.put(2)
        seen: list[int] = []
        during_put: list[int] = []

        def sink(item: int) -> bool:
            seen.append(item)
            return item < 4

        drained = asyncio.ensure_future(box.drain(sink))
        await asyncio.sleep(0)
        assert seen == [1, 2] and not drained.done()
        box.put(3)
        during_put.extend(seen)  # handed over inside put(), no task had to run
        box.put(4)  # declined: the drain ends
        await asyncio.wait_for(drained, 1)
        box.put(5)  # after the drain, items wait for a reader again
        return seen, during_put, await box.get()

    seen, during_put, left = asyncio.run(scenario())
    assert seen == [1, 2, 3, 4] and during_put == [1, 2, 3] and left == 5


def test_a_failing_sink_fails_the_drain_not_the_producer() -> None:
    async def scenario() -> str:
        box: Mailbox[int] = Mailbox()

        def sink(item: int) -> bool:
            raise ValueError(f"cannot take {item}")

        drained = asyncio.ensure_future(box.drain(sink))
        await asyncio.sleep(0)
        box.put(1)  # the producer (an engine step) carries on
        box.put(2)  # nobody drains any more: kept
        with pytest.raises(ValueError, match="cannot take 1"):
            await drained
        return await box.get()

    assert asyncio.run(scenario()) == 2


def test_a_cancelled_drain_leaves_the_mailbox_usable() -> None:
    async def scenario() -> int:
        box: Mailbox[int] = Mailbox()
        drained = asyncio.ensure_future(box.drain(lambda item: True))
        await asyncio.sleep(0)
        drained.cancel()
        await asyncio.gather(drained, return_exceptions=True)
        box.put(7)
        return await asyncio.wait_for(box.get(), 1)

    assert asyncio.run(scenario()) == 7

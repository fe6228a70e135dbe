"""The mailbox between an engine and a request's generator: order, waiting, wake-up."""

from __future__ import annotations

import asyncio

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

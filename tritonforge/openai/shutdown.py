"""The frontend's graceful stop: requests in flight finish, or end with an answer.

On SIGTERM (or Ctrl-C) uvicorn stops accepting connections at once — a load balancer's
next health check or request is refused — and waits for the requests in flight. Its
own timeout cancels whatever still runs, which cuts a stream without a word. So the
grace period is kept here: when it runs out, every Triton stream still open is ended
(:meth:`~tritonforge.openai.triton_client.TritonGateway.end_streams`): Triton cancels
its request, and its client gets :func:`shutting_down` — a stream its error event and
``[DONE]``, a request not answered yet a 503 with ``Retry-After``. uvicorn's own
timeout, a few seconds later, only backs that up.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

import uvicorn

from tritonforge.openai.errors import OpenAIError, unavailable

#: Seconds a graceful stop lets requests run by default: tritonserver's own default
#: ``--exit-timeout-secs``, so both sides of ``make serve`` agree.
DEFAULT_SHUTDOWN_GRACE_S = 30
#: Seconds after the grace period that uvicorn waits for the ended requests to send
#: their last event before it cancels them itself.
FLUSH_S = 3.0
#: A client told the server is stopping retries elsewhere, or here after a restart.
RETRY_AFTER_S = 5

log = logging.getLogger("tritonforge.openai")


def shutting_down(grace_s: float) -> OpenAIError:
    """What a request still running at the end of the grace period gets."""
    return unavailable(
        f"the server is shutting down: this request did not finish within the {grace_s:g} s "
        "shutdown grace period",
        RETRY_AFTER_S,
    )


class GracefulServer(uvicorn.Server):
    """uvicorn's server, ending the requests still in flight when ``grace_s`` has passed
    since its shutdown began (``end_in_flight``, which returns how many it ended)."""

    def __init__(
        self, config: uvicorn.Config, grace_s: float, end_in_flight: Callable[[], int]
    ) -> None:
        super().__init__(config)
        self.grace_s = grace_s
        self.end_in_flight = end_in_flight

    def _grace_over(self) -> None:
        if ended := self.end_in_flight():
            log.warning(
                "shutdown grace period of %g s over: %d request(s) ended with an error",
                self.grace_s,
                ended,
            )

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        timer = asyncio.get_running_loop().call_later(self.grace_s, self._grace_over)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

"""Notice, from inside a model, that the Triton server hosting it is shutting down.

On SIGTERM, Triton 2.51 waits up to ``--exit-timeout-secs`` for every request to end,
then gives up with "Exit timeout expired. Exiting immediately." — and in 2.51 that
path can crash or hang, leaving the stubs and the engines' processes behind. It
never tells a model that the server is stopping: the scheduler merely stops taking
new requests, and ``pb_utils.is_model_ready`` blocks the whole stub while the server
unloads (measured; it holds the GIL, so no response leaves). Long generations that
cannot finish within the exit timeout therefore hang the shutdown.

What is observable: on SIGTERM the server first stops answering on its HTTP endpoint
(it waits for open connections and closes new ones unanswered, then tears it down).
So the model asks its own server's HTTP endpoint whether it is live (address and port
from the parent's command line: the stub is a child of tritonserver) and, once the
endpoint closes a connection unanswered (or, having answered, refuses one), knows the
server is stopping. The runtime then lets
requests in flight run for a grace period that ends well before the exit timeout and
ends the rest with UNAVAILABLE, so the server unloads every model and exits cleanly.
Triton 2.51 workaround W15, see docs/triton-2.51-workarounds.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_HTTP_PORT = 8000
DEFAULT_EXIT_TIMEOUT_S = 30.0
#: Time kept, within the exit timeout, for the engine to wind down and the models to unload.
UNLOAD_RESERVE_S = 10.0


def _options(argv: list[str]) -> dict[str, str]:
    """``--name=value`` and ``--name value`` options of a tritonserver command line."""
    options: dict[str, str] = {}
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        name, sep, value = arg[2:].partition("=")
        if not sep:
            following = argv[i + 1] if i + 1 < len(argv) else ""
            value = "" if following.startswith("--") else following
        options[name] = value
    return options


@dataclass(frozen=True)
class ServerSettings:
    """What a model needs to know about the tritonserver process it runs under."""

    http_host: str | None  # None: the server has no HTTP endpoint to watch
    http_port: int
    exit_timeout_s: float

    @classmethod
    def from_argv(cls, argv: list[str]) -> ServerSettings:
        options = _options(argv)
        allow_http = options.get("allow-http", "true").lower() not in ("false", "0", "no")
        address = options.get("http-address", "0.0.0.0") or "0.0.0.0"
        host = (
            "127.0.0.1" if address in ("0.0.0.0", "") else ("::1" if address == "::" else address)
        )
        try:
            port = int(options.get("http-port", DEFAULT_HTTP_PORT))
        except ValueError:
            port = DEFAULT_HTTP_PORT
        try:
            exit_timeout = float(options.get("exit-timeout-secs", DEFAULT_EXIT_TIMEOUT_S))
        except ValueError:
            exit_timeout = DEFAULT_EXIT_TIMEOUT_S
        return cls(host if allow_http else None, port, exit_timeout)

    @classmethod
    def of_parent(cls) -> ServerSettings | None:
        """The settings of the parent process when it is a tritonserver, else None."""
        try:
            raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
        except OSError:
            return None
        argv = [part.decode(errors="replace") for part in raw.split(b"\0") if part]
        if not argv or Path(argv[0]).name != "tritonserver":
            return None
        return cls.from_argv(argv)

    def grace_s(self) -> float:
        """How long requests in flight may still run once the server is stopping."""
        return max(0.0, self.exit_timeout_s - UNLOAD_RESERVE_S)


class ShutdownWatch:
    """Polled on the runtime's loop: has the server begun to shut down?

    Each poll asks the server's HTTP endpoint ``GET /v2/health/live``. On SIGTERM,
    Triton 2.51 keeps accepting connections while it waits for the open ones, but
    closes each new one unanswered: that alone means the server is stopping (a server
    still starting refuses connections; its endpoint opens only after the startup
    models loaded). A connection refused or reset means stopping once the watch is
    armed, i.e. the endpoint answered before. The answer is sticky.
    """

    def __init__(self, settings: ServerSettings, timeout_s: float = 0.5) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self.armed = False  # the endpoint answered once
        self.stopping = False

    async def poll(self) -> bool:
        if self.stopping or self.settings.http_host is None:
            return self.stopping
        try:
            async with asyncio.timeout(self.timeout_s):
                answered = await self._live()
        except asyncio.IncompleteReadError:  # accepted, closed unanswered: stopping
            self.stopping = True
            return True
        except (ConnectionRefusedError, ConnectionResetError):
            answered = False
        except (OSError, TimeoutError):
            return False  # busy or unreachable: no evidence either way
        if answered:
            self.armed = True
        else:
            self.stopping = self.armed
        return self.stopping

    async def _live(self) -> bool:
        """True when the endpoint answered with a status line at all."""
        reader, writer = await asyncio.open_connection(
            self.settings.http_host, self.settings.http_port
        )
        try:
            writer.write(
                b"GET /v2/health/live HTTP/1.1\r\nHost: triton\r\nConnection: close\r\n\r\n"
            )
            await writer.drain()
            status = await reader.readuntil(b"\r\n")
            return status.startswith(b"HTTP/")
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def watch_server() -> ShutdownWatch | None:
    """A watch on the tritonserver this stub runs under (None outside one)."""
    settings = ServerSettings.of_parent()
    return ShutdownWatch(settings) if settings is not None else None

"""One log line per request that ended: off unless ``TRITONFORGE_LOG_REQUESTS`` turns it on.

Off by default, as vLLM's own request log is: in a model's stub a line crosses from the
stub to tritonserver through python_backend's logger, a round trip per line that costs
a request more than its whole trace does (perf/results/log-line). Failures are
logged whatever this says, each with its request's id.

A line names the request's id, how it ended, its token counts, its time to first token
and its duration, and its trace when it is traced; never its prompt or output text.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tritonforge.serving.errors import RequestError

if TYPE_CHECKING:
    from tritonforge.serving.runtime import RequestRecord

LOG_REQUESTS_ENV = "TRITONFORGE_LOG_REQUESTS"

_ON = {"1", "true", "yes", "on"}
_OFF = {"", "0", "false", "no", "off"}


def log_requests_from_env(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process writes a line per request (a bad value names the variable)."""
    raw = (os.environ if env is None else env).get(LOG_REQUESTS_ENV, "").strip().lower()
    if raw in _ON:
        return True
    if raw in _OFF:
        return False
    raise RequestError(LOG_REQUESTS_ENV, f"must be 1 or 0 (true/false, on/off), got {raw!r}")


def request_line(
    request_id: str, outcome: str, record: RequestRecord | None = None, trace_id: int | None = None
) -> str:
    """``request <id>: <outcome>, <p> prompt + <o> output tokens, first token after <t> ms,
    <d> ms (trace <id>)``; the counts and times come from the request's metrics record,
    when it has one (a refused request has none)."""
    parts = [f"request {request_id}: {outcome}"]
    if record is not None:
        parts.append(f"{record.prompt_tokens} prompt + {record.generation_tokens} output tokens")
        if record.ttft_s is not None:
            parts.append(f"first token after {record.ttft_s * 1000:.0f} ms")
        parts.append(f"{record.e2e_s * 1000:.0f} ms")
    line = ", ".join(parts)
    return line if trace_id is None else f"{line} (trace {trace_id:032x})"

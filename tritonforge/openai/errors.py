"""OpenAI's error shape, and what a Triton error means for an HTTP client.

Every error leaves as ``{"error": {"message", "type", "param", "code"}}`` with a status a
client can act on: 400 for a request it must fix, 404 for a model that is not there
(or not ready), 503 for "try again" (busy, deadline, unloading, Triton unreachable),
429 with ``Retry-After`` when the model's SLO admission says the request's SLO cannot
be met now (a load balancer can send it to another replica at once),
500 only for what is nobody's fault but ours.

A Triton gRPC *stream* carries an error as a message string without its status code,
so the mapping reads the message. The models of this project word their errors
predictably (docs/reference/requests.md, bad input): an invalid argument
starts with the field it concerns (``sampling_parameters.top_p: must be in (0, 1]``),
a full queue says "busy", an aborted request "deadline exceeded"; Triton's own
rejections have fixed phrases. Anything unrecognised is a 500 and says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tritonforge.openai.responses import ErrorBody, ErrorResponse

#: Inputs of the shared request schema: a message starting with one of these (after an
#: optional ``<inner model>: `` prefix, as guarded_chat relays) names a bad field.
_SCHEMA_FIELDS = (
    "text_input",
    "messages",
    "input_ids",
    "sampling_parameters",
    "parameters",
    "lora_name",
    "lora_path",
    "lora_control",
    "stream",
    "exclude_input_in_output",
    r"return_[a-z_]+",
    "id",  # the request's id: one already in flight (serving/request_ids.py)
)
_FIELD = re.compile(
    r"^(?:[A-Za-z0-9_.-]+: )?"  # guarded_chat: "vllm_model: text_input: prompt is …"
    r"((?:" + "|".join(_SCHEMA_FIELDS) + r")(?:[.\[][^\s:]*)?): "
)
_NOT_FOUND = ("Request for unknown model", "is not at ready state", "is not found")
_UNAVAILABLE = (
    "is busy",
    "busy:",
    "deadline exceeded",
    "is unloading",
    "was unloaded",
    "the engine failed",
    "Request timeout expired",
    "request cancelled",
)
#: Triton's own input validation (before any model code runs).
_TRITON_INVALID = re.compile(
    r"^(?:\[request id: [^\]]*\] )?(?:expected \d+ inputs|unexpected inference input"
    r"|unexpected shape for input|inference input '[^']*' data-type|input byte size mismatch"
    r"|unexpected additional input)"
)
#: The shared schema's sampling keys are OpenAI's body keys, and the prompt inputs map
#: back to the body key the client sent them in.
_PARAM_OF_INPUT = {
    "text_input": "prompt",
    "input_ids": "prompt",
    "sampling_parameters.structured_outputs": "response_format",
    "sampling_parameters.logprobs": "logprobs",
    "id": "X-Request-Id",  # the frontend sends the header's id as the Triton request's
}


@dataclass
class OpenAIError(Exception):
    """An error answered in OpenAI's shape with an HTTP status."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    #: Seconds a client should wait before retrying, sent as ``Retry-After`` (503s, 429s).
    retry_after_s: int | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> ErrorResponse:
        error = ErrorBody(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=error)


def invalid(message: str, param: str | None = None) -> OpenAIError:
    """400: the client must change the request."""
    return OpenAIError(400, message, "invalid_request_error", param, "invalid_value")


def model_not_found(model: str, why: str = "does not exist") -> OpenAIError:
    """404, worded as OpenAI's own, plus why (not loaded, not an LLM model, not ready)."""
    return OpenAIError(
        404, f"The model `{model}` {why}.", "invalid_request_error", "model", "model_not_found"
    )


#: Retry-After of a 503 while Triton itself is unreachable (restarting after a crash:
#: the launcher restarts it, a cold start takes seconds to minutes), and of any other.
TRITON_DOWN_RETRY_AFTER_S = 5
BUSY_RETRY_AFTER_S = 1


def unavailable(message: str, retry_after_s: int = BUSY_RETRY_AFTER_S) -> OpenAIError:
    """503: retry later (busy, deadline, unloading, Triton not reachable)."""
    return OpenAIError(503, message, "server_error", None, "service_unavailable", retry_after_s)


class TritonDown(OpenAIError):
    """Triton itself does not answer: its connection failed (down, or restarting after a
    crash). The request never reached a model that could answer it, so a request that
    has sent its client nothing may be sent again once Triton is back (carry_over.py)."""


def unreachable(url: str, detail: str = "") -> TritonDown:
    """503 while Triton at ``url`` does not answer (down, or restarting after a crash)."""
    message = f"Triton at {url} is not reachable" + (f": {detail}" if detail else "")
    return TritonDown(
        503, message, "server_error", None, "service_unavailable", TRITON_DOWN_RETRY_AFTER_S
    )


def internal(message: str) -> OpenAIError:
    return OpenAIError(500, message, "server_error", None, "internal_error")


def openai_param(field: str) -> str:
    """The body key a schema field came from: ``sampling_parameters.top_p`` → ``top_p``."""
    for prefix, param in _PARAM_OF_INPUT.items():
        if field == prefix or field.startswith((prefix + ".", prefix + "[")):
            return param
    return field.removeprefix("sampling_parameters.").removeprefix("parameters.")


#: The model's SLO admission refused the request (serving/admission.py words it so).
_SLO_REFUSED = re.compile(r"SLO admission refused the request: .*retry after (\d+) s")


def slo_unattainable(message: str, retry_after_s: int) -> OpenAIError:
    """429: this replica cannot meet the request's SLO now; retry later or elsewhere."""
    return OpenAIError(429, message, "requests", None, "slo_unattainable", retry_after_s)


def from_triton(message: str, model: str) -> OpenAIError:
    """Classify one Triton error message (a stream response or an RPC failure)."""
    if any(phrase in message for phrase in _NOT_FOUND):
        return model_not_found(model, f"is not available ({message})")
    if (refused := _SLO_REFUSED.search(message)) is not None:
        return slo_unattainable(message, int(refused.group(1)))
    lowered = message.lower()
    if any(phrase.lower() in lowered for phrase in _UNAVAILABLE):
        return unavailable(message)
    if (match := _FIELD.match(message)) is not None:
        return invalid(message, openai_param(match.group(1)))
    if _TRITON_INVALID.match(message):
        return invalid(message)
    return internal(message)

"""The reliability suite's own parts, without a server.

The malformed-request generator is checked against the request schema: every request it
builds must be refused by ``parse_request`` with an error naming the field the generator
expects. Otherwise a failure in the end-to-end storm could be the generator's mistake
(a request that is in fact valid, or an expectation naming the wrong field) rather
than the server's.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings

from tritonforge.bench.reliability.clients import bytes_raw, grpc_request
from tritonforge.bench.reliability.malformed import Malformed, malformed_requests
from tritonforge.bench.reliability.models import models_to_load
from tritonforge.bench.reliability.probes import parse_metric, shutdown_log
from tritonforge.serving.errors import RequestError, printable
from tritonforge.serving.schema import parse_request

# Checked only after tokenising, against the model's context and vocabulary (engine side).
ENGINE_SIDE = ("context/", "prompt/too_long")


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=malformed_requests())
def test_every_generated_request_is_refused_naming_the_expected_field(case: Malformed) -> None:
    if case.what.startswith(ENGINE_SIDE):
        return
    inputs = {
        name: np.array([getattr(case, name).encode()], dtype=np.object_)
        for name in ("text_input", "messages", "sampling_parameters")
        if getattr(case, name) is not None
    }
    try:
        parse_request(inputs, case.parameters or {})
    except RequestError as error:
        assert printable(case.field) in str(error), (case, str(error))
    else:
        raise AssertionError(f"the schema accepts a request built to be malformed: {case}")


@settings(max_examples=100, deadline=None, database=None)
@given(case=malformed_requests())
def test_http_bodies_are_json_and_never_a_frontend_500_shape(case: Malformed) -> None:
    """The shapes Triton's HTTP frontend answers 500 are left out
    (docs/triton-2.51-workarounds.md)."""
    body = case.http_body()
    assert not {"stream", "exclude_input_in_output", "input_ids"} & set(body)
    assert all(isinstance(body[k], str) for k in ("text_input", "messages") if k in body)
    for value in (body.get("parameters") or {}).values():
        assert isinstance(value, str | bool | int | float)


def test_models_to_load_adds_an_ensembles_steps_once() -> None:
    assert models_to_load(["vllm_model", "ensemble_vllm"]) == [
        "vllm_model",
        "preprocessing",
        "postprocessing",
        "ensemble_vllm",
    ]


def test_parse_metric_sums_one_models_series() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model="vllm_model",version="1"} 3\n'
        'vllm:num_requests_running{model="other",version="1"} 5\n'
        'vllm:request_outcome_total{model="vllm_model",outcome="cancelled"} 2\n'
    )
    assert parse_metric(text, "vllm:num_requests_running", "vllm_model") == 3
    assert parse_metric(text, "vllm:num_requests_running") == 8
    assert parse_metric(text, "vllm:kv_cache_usage_perc", "vllm_model") == 0


def test_grpc_request_asks_for_the_empty_final_response() -> None:
    request = grpc_request("m", {"text_input": "héllo", "stream": True})
    assert request.parameters["triton_enable_empty_final_response"].bool_param
    assert [(i.name, i.datatype, list(i.shape)) for i in request.inputs] == [
        ("text_input", "BYTES", [1]),
        ("stream", "BOOL", [1]),
    ]
    assert request.raw_input_contents[0] == bytes_raw("héllo") == b"\x06\x00\x00\x00h\xc3\xa9llo"
    assert request.raw_input_contents[1] == b"\x01"


def test_shutdown_log_starts_at_sigterm_and_folds_the_countdown(tmp_path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "I started\nSignal (15) received.\n"
        + "".join(
            f'I http_server.cc] "Timeout {n}: Found 2 HTTP service connections"\n' for n in (3, 2)
        )
        + 'E main.cc] "failed to stop server: Internal - Exit timeout expired."\n'
    )
    assert shutdown_log(log) == [
        "Signal (15) received.",
        "[2 countdown lines]",
        'E main.cc] "failed to stop server: Internal - Exit timeout expired."',
    ]
    assert shutdown_log(tmp_path / "missing.log") == []

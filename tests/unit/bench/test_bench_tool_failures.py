"""A load tool that exits badly or exports nothing usable fails its level, not the run.

The tools are stand-in scripts (no server): they print an error to stderr, exit with a
chosen code and leave the export missing, empty or malformed, as perf_analyzer did on
an Intel host (an empty export must fail its level, not crash the runner with a
JSONDecodeError).
"""

from __future__ import annotations

import io
import json
import stat
import sys
from pathlib import Path

import pytest
from rich.console import Console

from tests.unit.bench.helpers import environment, smoke_run
from tritonforge.bench import aiperf_driver, lifecycle, perf_analyzer_driver, report
from tritonforge.bench import runner as runner_module
from tritonforge.bench.aiperf_driver import HttpEndpoint
from tritonforge.bench.contract import Sampling, load_contract
from tritonforge.bench.metrics import MeasuredRequest
from tritonforge.bench.noise import RoundWatch
from tritonforge.bench.offline_ceiling import OfflineCeiling
from tritonforge.bench.results import TargetResult
from tritonforge.bench.run_plan import LevelLoad, RunPlan
from tritonforge.bench.runner import Runner
from tritonforge.bench.tools import ToolError
from tritonforge.bench.workload import BenchRequest

CONTRACT = Path(__file__).resolve().parents[3] / "perf" / "contracts" / "smoke.yaml"
REQUESTS = [BenchRequest(i, "chat", f"p{i}", 10, 3, False) for i in range(2)]

# Writes $EXPORT's content (unless it is "-") to the file after --profile-export-file,
# or to ./profile_export.jsonl (aiperf), then fails the way the test asks.
FAKE_TOOL = """#!{python}
import pathlib, sys
args = sys.argv[1:]
content, code = {content!r}, {code}
if "--profile-export-file" in args:
    export = pathlib.Path(args[args.index("--profile-export-file") + 1])
else:
    export = pathlib.Path("profile_export.jsonl")
if content is not None:
    export.write_text(content)
sys.stderr.write("tool: cannot reach the server (connection refused)\\n")
sys.exit(code)
"""


def fake_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | None, code: int):
    script = tmp_path / "fake_tool"
    script.write_text(FAKE_TOOL.format(python=sys.executable, content=content, code=code))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    for driver in (aiperf_driver, perf_analyzer_driver):
        monkeypatch.setattr(driver, "tool_binary", lambda name: script)


def run_perf_analyzer(tmp_path: Path) -> list:
    return perf_analyzer_driver.run_level(
        "127.0.0.1:1", "m", REQUESTS, Sampling(), tmp_path / "level", 2, max_duration_s=30
    )


def run_aiperf(tmp_path: Path) -> list:
    endpoint = HttpEndpoint(url="http://127.0.0.1:1", model="m", endpoint_type="completions")
    return aiperf_driver.run_level(
        endpoint,
        REQUESTS,
        tmp_path / "trace.jsonl",
        tmp_path / "level",
        tokenizer=tmp_path,
        mode="concurrency",
        level=2,
        max_duration_s=30,
        seed=1,
        exact_lengths=True,
    )


@pytest.mark.parametrize(
    ("content", "code", "reason"),
    [
        ("", 1, "JSONDecodeError"),  # the Intel-host case: empty export, tool's own error
        ("", 0, "JSONDecodeError"),
        ("{truncated", 0, "JSONDecodeError"),
        ("[1, 2]", 0, "expected a JSON object"),
        ('{"experiments": [{"requests": [{"no_timestamp": 1}]}]}', 0, "KeyError"),
        ('{"experiments": []}', 0, "no request records"),
        (None, 99, "no profile_export.json written"),
    ],
)
def test_perf_analyzer_without_usable_output_raises_tool_error_with_code_and_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | None, code: int, reason: str
) -> None:
    fake_tool(tmp_path, monkeypatch, content, code)
    with pytest.raises(ToolError) as caught:
        run_perf_analyzer(tmp_path)
    error = caught.value
    assert error.exit_code == code
    assert f"exited with code {code}" in error.reason and reason in error.reason
    assert "connection refused" in error.log_tail


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "no profile_export.jsonl written"),
        ("", "no request records"),
        ('{"metadata": {"benchmark_phase": "profiling"', "JSONDecodeError"),
        ('{"no_metadata": 1}\n', "KeyError"),
    ],
)
def test_aiperf_without_usable_output_raises_tool_error_with_code_and_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | None, reason: str
) -> None:
    fake_tool(tmp_path, monkeypatch, content, 3)
    with pytest.raises(ToolError) as caught:
        run_aiperf(tmp_path)
    assert caught.value.exit_code == 3 and reason in caught.value.reason
    assert "connection refused" in caught.value.log_tail


def test_a_tool_that_writes_nothing_at_all_still_explains_itself(tmp_path: Path) -> None:
    from tritonforge.bench.tools import read_records, run_tool

    silent = tmp_path / "silent"
    silent.write_text("#!/bin/sh\nexit 0\n")
    silent.chmod(0o755)
    run = run_tool("silent", [str(silent)], tmp_path / "silent.log", timeout_s=30)
    with pytest.raises(ToolError) as caught:
        read_records(run, tmp_path / "export.json", lambda path: [])
    assert caught.value.exit_code == 0
    assert caught.value.log_tail == "(the tool wrote no output)"


class FakeService:
    """A started server as far as the runner can tell: only its endpoint is used."""

    def endpoint(self, target, served_model, sampling) -> HttpEndpoint:
        return HttpEndpoint(url="http://127.0.0.1:1", model="m", endpoint_type="completions")

    def metrics_text(self) -> None:
        return None


AIPERF_RECORD = {
    "metadata": {
        "session_num": 0,
        "benchmark_phase": "profiling",
        "request_start_ns": 1_000_000,
        "request_end_ns": 9_000_000,
    },
    "metrics": {
        "time_to_first_token": {"value": 2.5},
        "inter_chunk_latency": {"value": [1.0]},
        "output_sequence_length": {"value": 2},
    },
}


class CalmWatch(RoundWatch):
    """The real watch, but the machine always quiet: other tests and sessions on this
    machine must not turn a noisy-round retry into a different call order here."""

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        assert self.sample is not None
        self.sample = self.sample.model_copy(update={"foreign_cpu_share_during": 0.0})


@pytest.fixture(autouse=True)
def calm_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module, "RoundWatch", CalmWatch)


def plan_for(tmp_path: Path) -> RunPlan:
    """The smoke contract at levels 1 and 4, without warm-up, writing under ``tmp_path``."""
    contract, digest = load_contract(CONTRACT, ["load.warmup_requests=0", "load.rounds=2"])
    levels = [
        LevelLoad(lv, REQUESTS, tmp_path / "trace.jsonl", tmp_path / "w.json") for lv in (1, 4)
    ]
    return RunPlan(
        contract, CONTRACT, digest, [], tmp_path, tmp_path / "run", tmp_path, levels, None
    )


def test_a_failed_level_is_recorded_and_the_next_level_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = plan_for(tmp_path)
    contract, digest = plan.contract, plan.contract_sha256
    target = next(t for t in contract.targets if t.tool == "aiperf" and t.model)
    calls: list[float] = []
    real_drive = Runner.drive

    def drive(self, service, target, load, artifacts):
        calls.append(load.level)
        if load.level == 1:  # an empty export, exit code 1
            fake_tool(tmp_path, monkeypatch, "", 1)
        else:  # one good record
            fake_tool(tmp_path, monkeypatch, json.dumps(AIPERF_RECORD) + "\n", 0)
        return real_drive(self, service, target, load, artifacts)

    monkeypatch.setattr(Runner, "drive", drive)
    monkeypatch.setattr(runner_module, "QUIET_WINDOW_S", 0.0)
    runner = Runner(plan, Console(file=io.StringIO()))
    result = runner.warm_up(FakeService(), target, startup_s=1.0)
    runner.run_rounds({target.name: FakeService()}, [target], {target.name: result})
    result = runner.settle(result)

    # Level by level, each in both rounds; a round whose tool failed is run once more.
    assert calls == [1, 1, 1, 1, 4, 4]
    assert [n.split(":")[0] for n in result.notes] == ["1 round 1", "1 round 2"]
    assert result.status == "partial"
    assert [(m.level, m.round) for m in result.levels] == [(4, 0), (4, 1)]
    assert all(m.noise is not None for m in result.levels)  # every round watched
    failure = result.failed_levels["1 round 1"]
    assert failure.exit_code == 1 and "no request records" in failure.error
    assert "connection refused" in failure.log_tail
    saved = json.loads(result.model_dump_json())["failed_levels"]["1 round 2"]
    assert saved["exit_code"] == 1 and "connection refused" in saved["log_tail"]

    run = smoke_run(contract, digest, [result], comparisons=[])
    text = report.render(run, [])
    assert "| 1 round 1 | failed: aiperf exited with code 1" in text
    assert "connection refused" in text


def test_an_offline_engine_with_unreadable_output_fails_its_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = plan_for(tmp_path)
    target = next(t for t in plan.contract.targets if t.kind.value == "vllm_offline")

    def engine(self, job_path: Path, out_path: Path, log: Path) -> int:
        out_path.write_text("")  # exit 0, but nothing usable written
        log.write_text("engine: out of memory\n")
        return 0

    monkeypatch.setattr(OfflineCeiling, "job", lambda self, target: {})
    monkeypatch.setattr(OfflineCeiling, "run_engine", engine)
    result = Runner(plan, Console(file=io.StringIO())).run_offline(target)
    assert result.status == "failed"
    assert "unreadable records.json (JSONDecodeError" in result.error
    assert "out of memory" in result.error


def test_the_runner_starts_every_server_once_and_rotates_the_targets_each_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tritonforge.bench.contract import TargetKind

    plan = plan_for(tmp_path)  # smoke: 3 served targets + the offline ceiling, 2 rounds
    started: list[str] = []
    stopped: list[str] = []

    class Served(FakeService):
        def __init__(self, kind, targets) -> None:
            self.label = ",".join(t.name for t in targets)

        def start(self) -> None:
            started.append(self.label)

        def wait_ready(self) -> None:
            pass

        def stop(self) -> None:
            stopped.append(self.label)

    order: list[tuple[float, str]] = []

    def drive(self, service, target, load, artifacts):
        order.append((load.level, target.name))
        return [MeasuredRequest(0, 0, 10**8, True, 8, 5.0, [], None, 8)]

    monkeypatch.setattr(lifecycle, "service_for", lambda kind, t, logs, served: Served(kind, t))
    monkeypatch.setattr(runner_module, "QUIET_WINDOW_S", 0.0)
    monkeypatch.setattr(Runner, "drive", drive)
    monkeypatch.setattr(
        Runner,
        "run_offline",
        lambda self, t: TargetResult(name=t.name, kind="x", tool="y", status="ok"),
    )
    runner = Runner(plan, Console(file=io.StringIO()))
    checkpoints: list[list[int]] = []
    runner.on_level_done = lambda ts: checkpoints.append([len(t.levels) for t in ts])
    results = runner.run()

    # One Triton for both Triton targets, one vLLM server; each started and stopped once.
    assert started == ["triton-vllm,triton-vllm-grpc", "vllm-openai"]
    assert sorted(stopped) == sorted(started)
    served = [t.name for t in plan.contract.targets if t.kind is not TargetKind.VLLM_OFFLINE]
    a, b, c = served
    rotation = [a, b, c, b, c, a]  # round 1 in contract order, round 2 starting at b
    assert order == [(level, name) for level in (1, 4) for name in rotation]
    # A checkpoint after each level, with both rounds of it for every served target.
    assert checkpoints == [[2, 2, 2], [4, 4, 4]]
    by_name = {r.name: r for r in results}
    assert [(m.level, m.round) for m in by_name[a].levels] == [(1, 0), (1, 1), (4, 0), (4, 1)]
    assert by_name[a].startup_s is not None and by_name[a].status == "ok"


def test_a_run_stopped_part_way_keeps_what_it_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = plan_for(tmp_path)
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    env = environment()

    def stopped(self) -> list:  # one round measured, then SIGTERM
        result = TargetResult(name="triton-vllm", kind="triton", tool="aiperf", status="ok")
        self.record(result, 1, [MeasuredRequest(0, 0, 10**8, True, 8, 5.0, [], None, 8)])
        self.results["triton-vllm"] = result
        raise SystemExit(143)

    monkeypatch.setattr(runner_module, "prepare", lambda *args: plan)
    monkeypatch.setattr(runner_module, "capture", lambda model_dir, code=None: env)
    monkeypatch.setattr(Runner, "run", stopped)
    with pytest.raises(SystemExit):
        runner_module.run_contract(CONTRACT, [], tmp_path, Console(file=io.StringIO()))
    saved = json.loads((plan.run_dir / "results.json").read_text())
    assert saved["finished_at"].startswith("not finished")
    assert saved["targets"][0]["levels"][0]["output_tokens"] == 8


@pytest.mark.parametrize("host_handles_sigterm", [False, True])
def test_sigterm_unwinds_a_run_and_the_hosts_handler_comes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_handles_sigterm: bool
) -> None:
    """A bare CLI run turns SIGTERM into SystemExit for as long as it lasts; a host that
    handles SIGTERM itself (the test session: an interrupt) keeps its handler throughout."""
    import signal

    def host(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    before = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, host if host_handles_sigterm else signal.SIG_DFL)
    seen: list[object] = []

    def run(*args: object) -> Path:
        seen.append(signal.getsignal(signal.SIGTERM))
        return tmp_path

    monkeypatch.setattr(runner_module, "_run", run)
    try:
        assert runner_module.run_contract(CONTRACT, [], tmp_path) == tmp_path
        during, after = seen[0], signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, before)
    if host_handles_sigterm:
        assert during is host and after is host
    else:
        assert during is runner_module._exit_on_sigterm and after is signal.SIG_DFL

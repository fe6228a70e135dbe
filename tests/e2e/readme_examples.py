"""The request examples of README.md and docs/, taken from the pages themselves and run
against a real server.

A documented example is a promise: pasted into a shell or a Python prompt beside `make
serve`, it answers. The runners here rewrite the documented addresses (HTTP 8000, gRPC
8001, OpenAI 9000) to a test server's free ports, run the example as written (curl in
bash, Python with `exec`), and check the answer's shape — status, documented fields,
non-empty generated text, token counts — never its words: a greedy 135M model answers
differently on different CPUs (docs/troubleshooting.md).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonforge.launch.launcher import MODEL_REPOSITORY, REPO_ROOT

#: Pages whose examples other tests own: the upstream differences (error answers included,
#: tests/e2e/test_upstream_compat.py) and the benchmark runs (tests/e2e/test_bench_*.py).
OWNED_ELSEWHERE = ("docs/compatibility.md", "docs/benchmarking.md")


def documentation() -> tuple[Path, ...]:
    """The files whose examples are run: the README, every page of docs/, the pipelines'."""
    docs = sorted((REPO_ROOT / "docs").rglob("*.md"))
    pages = [p for p in docs if str(p.relative_to(REPO_ROOT)) not in OWNED_ELSEWHERE]
    return (REPO_ROOT / "README.md", *pages, REPO_ROOT / "ensembles" / "README.md")


SOURCES = documentation()
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_ADDRESS = re.compile(r"(?:http://)?(?:localhost|127\.0\.0\.1):(8000|8001|9000)")


@dataclass(frozen=True)
class Block:
    """One fenced block of a documentation page."""

    source: str  # path relative to the repository
    lang: str
    code: str
    line: int  # of the opening fence, 1-based

    @property
    def id(self) -> str:
        return f"{self.source}:{self.line}"

    def is_request(self) -> bool:
        return self.lang == "python" or bool(re.search(r"^\s*curl ", self.code, re.M))

    def is_own_model(self) -> bool:
        """A step of serving one's own model: writing it with the repository tool, or
        loading it (tests/e2e/test_your_own_model.py runs these on a server of its own)."""
        return "tritonforge.repo add" in self.code or "/v2/repository/models/" in self.code


def blocks(sources: tuple[Path, ...] = SOURCES) -> list[Block]:
    found = []
    for path in sources:
        text = path.read_text()
        source = str(path.relative_to(REPO_ROOT))
        found += [
            Block(source, m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
            for m in _FENCE.finditer(text)
        ]
    return found


@dataclass(frozen=True)
class Addresses:
    """Where the documented ports are served in a test: host:port each."""

    http: str
    grpc: str
    openai: str | None = None  # host:port of the OpenAI frontend

    def rewrite(self, code: str) -> str:
        def replace(match: re.Match[str]) -> str:
            scheme = "http://" if match.group(0).startswith("http://") else ""
            target = {"8000": self.http, "8001": self.grpc, "9000": self.openai}[match.group(1)]
            if target is None:
                raise AssertionError(f"{match.group(0)} needs the OpenAI frontend")
            return scheme + target

        return _ADDRESS.sub(replace, code)


@dataclass(frozen=True)
class Curl:
    """One curl command of a block, with the output the page documents under it."""

    command: str
    documented: str | None  # a `# {...}` comment right after the command


def curl_commands(code: str) -> list[Curl]:
    """Split a shell block into its curl commands (joined over `\\` and quoted newlines)."""
    commands: list[list[str]] = []
    documented: list[str | None] = []
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith("curl "):
            commands.append([line])
            documented.append(None)
        elif stripped.startswith("#"):
            comment = stripped[1:].strip().removeprefix("for instance:").strip()
            if commands and documented[-1] is None and comment.startswith("{"):
                documented[-1] = comment
        elif commands and stripped:
            commands[-1].append(line)
    return [Curl("\n".join(c), d) for c, d in zip(commands, documented, strict=True)]


def _body(command: str) -> dict:
    words = shlex.split(command.replace("\\\n", " "))
    return json.loads(words[words.index("-d") + 1]) if "-d" in words else {}


def _events(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


def run_curl(curl: Curl, addresses: Addresses, timeout_s: float = 300) -> None:
    """Run one curl command as written (ports rewritten) and check its answer's shape."""
    command = addresses.rewrite(curl.command) + " -w '\\n%{http_code}'"
    done = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert done.returncode == 0, f"curl failed ({done.returncode}): {done.stderr}"
    text, _, status = done.stdout.rpartition("\n")
    assert status == "200", f"HTTP {status}: {text[:500]}"
    body = _body(curl.command)
    url = re.search(r"(?:localhost|127\.0\.0\.1):\d+(\S*)", curl.command).group(1)
    if url.startswith("/v2/repository/"):  # model control: an empty answer, status only
        return
    if url.startswith("/v1/"):
        _check_openai(url, body, text)
    else:
        _check_triton(url, body, text, curl.documented)


def _generated(body: dict, text_output: str) -> str:
    """What the model added: an LLM model echoes a non-streamed text prompt unless excluded
    (an ensemble's postprocessing and the guard do not), so an echo alone is no answer."""
    prompt = body.get("text_input")
    if prompt and text_output.startswith(prompt):
        return text_output[len(prompt) :]
    return text_output


def _check_triton(url: str, body: dict, text: str, documented: str | None) -> None:
    if url.endswith("/generate_stream"):
        events = [json.loads(e) for e in _events(text)]
        assert events, f"no server-sent events: {text[:500]}"
        assert all("error" not in e and "text_output" in e for e in events), events
        generated = "".join(e["text_output"] for e in events)
    else:
        answer = json.loads(text)
        assert "error" not in answer, answer
        if documented is not None:  # the page's example answer: same fields
            assert set(json.loads(documented)) <= set(answer), (documented, answer)
        generated = _generated(body, answer["text_output"])
    assert generated.strip(), f"nothing generated: {text[:500]}"


def _check_openai(url: str, body: dict, text: str) -> None:
    chat = url.endswith("/chat/completions")
    if body.get("stream"):
        events = _events(text)
        assert events and events[-1] == "[DONE]", f"stream does not end with [DONE]: {text[-300:]}"
        chunks = [json.loads(e) for e in events[:-1]]
        assert all("error" not in c for c in chunks), chunks
        pieces = [
            (c["choices"][0].get("delta", {}).get("content") if chat else c["choices"][0]["text"])
            for c in chunks
            if c.get("choices")
        ]
        assert "".join(p or "" for p in pieces).strip(), f"nothing generated: {text[:500]}"
        if body.get("stream_options", {}).get("include_usage"):
            _check_usage(chunks[-1].get("usage"))
        return
    answer = json.loads(text)
    choice = answer["choices"][0]
    content = choice["message"]["content"] if chat else choice["text"]
    assert content and content.strip(), f"empty answer: {answer}"
    assert choice["finish_reason"] in ("stop", "length"), answer
    _check_usage(answer.get("usage"))


def _check_usage(usage: Any) -> None:
    if isinstance(usage, dict):
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    else:
        prompt = getattr(usage, "prompt_tokens", None)
        completion = getattr(usage, "completion_tokens", None)
    assert prompt and prompt > 0 and completion and completion > 0, f"usage: {usage}"


@dataclass
class Printed:
    """What a Python example prints, as objects (its `print` is replaced)."""

    lines: list[tuple[Any, ...]] = field(default_factory=list)  # print(...) calls ending a line
    stream: list[Any] = field(default_factory=list)  # print(..., end="") pieces

    def __call__(self, *args: Any, end: str = "\n", **_: Any) -> None:
        (self.lines.append(args) if end == "\n" else self.stream.extend(args))


def run_python(code: str, addresses: Addresses) -> Printed:
    """`exec` a Python example with its addresses rewritten; check what it printed."""
    printed = Printed()
    exec(compile(addresses.rewrite(code), "<documented example>", "exec"), {"print": printed})
    everything = [a for line in printed.lines for a in line] + printed.stream
    errors = [a for a in everything if isinstance(a, BaseException)]
    assert not errors, f"the example printed errors: {errors}"
    assert printed.lines or printed.stream, "the example printed nothing"
    for line in printed.lines:  # each printed answer is non-empty; usage beside it counts
        assert line and isinstance(line[0], str) and line[0].strip(), f"empty answer: {line}"
        for usage in line[1:]:
            _check_usage(usage)
    if printed.stream:
        streamed = "".join(str(p) for p in printed.stream)
        assert streamed.strip(), f"the stream generated nothing: {printed.stream!r}"
    return printed


def models(block: Block) -> set[str]:
    """The models of model_repository/ a block names."""
    names = {p.name for p in MODEL_REPOSITORY.iterdir() if (p / "config.pbtxt").exists()}
    return names & set(re.findall(r"\w+", block.code))


def run_block(block: Block, addresses: Addresses) -> None:
    """Run a request block: its Python code, or every curl command in it."""
    if block.lang == "python":
        run_python(block.code, addresses)
        return
    curls = curl_commands(block.code)
    assert curls, f"{block.id}: no curl command found"
    for curl in curls:
        run_curl(curl, addresses)

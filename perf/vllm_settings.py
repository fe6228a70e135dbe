"""vllm_model through Triton under different engine settings, served side by side.

Why: the adapter chooses dtype and OpenMP binding per host (tritonforge/engines/
host_settings.py); this measures what the choice is worth where it matters, through
the whole serving path. Each *variant* is ``model_repository/vllm_model`` with its
model.json keys overridden, served as its own model in ONE tritonserver (plus any idle
``--with`` models, e.g. ``make serve``'s second vLLM model), so variants share the
machine the way a served repository does. In interleaved rounds (variants' order
rotated every round, concurrency levels in turn) every request streams exactly
``--tokens`` forced tokens (greedy, ``ignore_eos``) over HTTP ``generate_stream``.

    .venv/bin/python perf/vllm_settings.py --rounds 3 --concurrency 1,8 \\
        --variant 'new={}' --variant 'old={"dtype": "bfloat16", "cpu_omp_threads_bind": "auto"}' \\
        --with vllm_lora_model --target 'new@8/new@1>=4' --target 'new@8/old@8>=3' \\
        --target 'ttft:new@1/old@1<=1'

A ``--code name=commit`` variant serves ``vllm_model`` with the serving code of an older
commit instead (its ``tritonforge`` package, model directory and backend ``model.py``,
imported in that model's own stub), so a change of the serving path is compared with the
code before it against the same engine in one server:

    VLLM_CPU_OMP_THREADS_BIND=0-1 .venv/bin/python perf/vllm_settings.py --rounds 3 \\
        --concurrency 1,8 --variant 'new={}' --code 'old=58ba469' \\
        --target 'new@8/old@8>=0.95' --target 'ttft:new@1/old@1<=1.05'

(The binding is set for both in the server's environment: code that predates the
per-host settings would otherwise leave vLLM's own.)

Per round and level: output tokens/s (all tokens ÷ the level's wall time), TTFT p50,
the foreign CPU share (tritonforge.bench.noise) and the CPU each server process used.
A target ``a@C/b@C>=x`` is a ratio of tokens/s (``ttft:`` — of TTFT p50) per round,
judged by the project's rule (tritonforge.bench.results.judge): met only if every
round is on its side. Writes ``perf/results/vllm-settings/<UTC timestamp>/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tritonforge.bench.environment import capture  # noqa: E402
from tritonforge.bench.noise import RoundWatch  # noqa: E402
from tritonforge.bench.results import judge  # noqa: E402
from tritonforge.bench.workload import random_words  # noqa: E402
from tritonforge.launch.launcher import MODEL_REPOSITORY, TritonServer, server_environment  # noqa: E402
from tritonforge.paths import new_run_dir  # noqa: E402

#: Environment variables that change what every engine in the server runs (binding, ISA caps).
ENGINE_ENVIRONMENT = (
    "VLLM_CPU_OMP_THREADS_BIND",
    "ONEDNN_MAX_CPU_ISA",
    "ATEN_CPU_CAPABILITY",
    "OMP_NUM_THREADS",
)

TARGET = re.compile(r"^(ttft:)?(\w+)@(\d+)/(\w+)@(\d+)(>=|<=)([\d.]+)$")


def build_repository(root: Path, variants: dict[str, dict], extra: list[str]) -> None:
    """vllm_model once per variant (its model.json overridden), plus the extra models as shipped."""
    for name, overrides in variants.items():
        shutil.copytree(MODEL_REPOSITORY / "vllm_model", root / name)
        settings_file = root / name / "1" / "model.json"
        settings = json.loads(settings_file.read_text()) | overrides
        settings_file.write_text(json.dumps(settings, indent=2))
    for name in extra:
        shutil.copytree(MODEL_REPOSITORY / name, root / name)


OLD_CODE_MODEL_PY = """
import sys
sys.path.insert(0, {tree!r})  # this commit's tritonforge, before the installed one
{backend}
"""


def build_from_commit(root: Path, name: str, commit: str) -> None:
    """``vllm_model`` as served at ``commit``: its package, model directory and backend."""
    tree = root / f".code-{name}"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "archive", commit, "tritonforge", "backends/vllm", "model_repository/vllm_model"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    shutil.copytree(tree / "model_repository/vllm_model", root / name)
    config = root / name / "config.pbtxt"
    config.write_text(config.read_text().replace('backend: "vllm"', 'backend: "python"'))
    backend = (tree / "backends/vllm/model.py").read_text()
    (root / name / "1" / "model.py").write_text(
        OLD_CODE_MODEL_PY.format(tree=str(tree), backend=backend)
    )


def one_request(url: str, prompt: str, tokens: int) -> dict:
    """Stream one request; its TTFT, end and token count as the client saw them."""
    body = {
        "text_input": prompt,
        "stream": True,  # one response per delta: without it the first is the whole answer
        "exclude_input_in_output": True,
        "return_num_output_tokens": True,
        "parameters": {"temperature": 0, "max_tokens": tokens, "ignore_eos": True},
    }
    start = time.perf_counter()
    first, count = None, 0
    with requests.post(url, json=body, stream=True, timeout=600) as reply:
        for line in reply.iter_lines():
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"])
            got = event.get("num_output_tokens", 0)
            count += sum(got) if isinstance(got, list) else int(got)
            if first is None and count:
                first = time.perf_counter()
    end = time.perf_counter()
    return {"start": start, "end": end, "ttft_ms": ((first or end) - start) * 1000, "tokens": count}


def run_level(server: TritonServer, model: str, level: int, opts, rng: random.Random) -> dict:
    """``level`` requests in flight at once, ``opts.waves`` times over; tokens/s and TTFT p50."""
    url = f"http://{server.http_url}/v2/models/{model}/generate_stream"
    prompts = [random_words(rng, opts.prompt_words) for _ in range(level * opts.waves)]
    with ThreadPoolExecutor(level) as pool:
        records = list(pool.map(lambda p: one_request(url, p, opts.tokens), prompts))
    wall = max(r["end"] for r in records) - min(r["start"] for r in records)
    tokens = sum(r["tokens"] for r in records)
    return {
        "requests": len(records),
        "tokens": tokens,
        "short": sum(r["tokens"] < opts.tokens for r in records),
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 2),
        "ttft_p50_ms": round(statistics.median(r["ttft_ms"] for r in records), 1),
    }


def server_cpu(server: TritonServer) -> dict[str, float]:
    """CPU seconds of tritonserver and each of its descendants, keyed by who they are."""
    out = {}
    for proc in [psutil.Process(server.process.pid), *server.descendants()]:
        try:
            times = proc.cpu_times()
            words = proc.cmdline()
            model = next((w.split("/")[-3] for w in words if w.endswith("/model.py")), "")
            out[f"{proc.name()} {model} ({proc.pid})".replace("  ", " ")] = (
                times.user + times.system
            )
        except psutil.Error:
            continue
    return out


def measure(server: TritonServer, variants: list[str], opts) -> list[dict]:
    rows = []
    for index in range(opts.rounds):
        rng = random.Random(index)
        for level in opts.concurrency:
            shift = (index + opts.concurrency.index(level)) % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                # an engine that just ran keeps polling its queues for about a second
                # (vLLM's shm_broadcast): let it stop before the next variant's level
                time.sleep(opts.settle_s)
                before = server_cpu(server)
                with RoundWatch(quiet_window_s=2.0) as watch:
                    result = run_level(server, variant, level, opts, rng)
                after = server_cpu(server)
                assert watch.sample is not None
                used = {k: round(after[k] - v, 2) for k, v in before.items() if k in after}
                row = {"round": index, "variant": variant, "concurrency": level, **result}
                row |= {"noise": watch.sample.model_dump(), "server_cpu_s": used}
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "server_cpu_s"}), flush=True)
    return rows


def judge_targets(rows: list[dict], targets: list[str], rounds: int, bound: float) -> list[dict]:
    noisy = any(r["noise"]["foreign_cpu_share_during"] > bound for r in rows)
    out = []
    for text in targets:
        match = TARGET.match(text.replace(" ", ""))
        if match is None:
            raise SystemExit(f"--target {text!r}: want [ttft:]a@C/b@C>=x")
        ttft, a, ca, b, cb, op, x = match.groups()
        key = "ttft_p50_ms" if ttft else "tokens_per_s"

        def value(variant: str, level: str, index: int, key: str = key) -> float:
            return next(
                r[key]
                for r in rows
                if (r["variant"], r["concurrency"], r["round"]) == (variant, int(level), index)
            )

        ratios = [value(a, ca, i) / value(b, cb, i) for i in range(rounds)]
        out.append(
            {
                "target": text,
                "per_round": [round(r, 3) for r in ratios],
                # The project's rule: a noisy run gets no verdict; the rounds' side is
                # still recorded so a reader sees where they fell.
                "verdict": judge(ratios, float(x), op == ">=", "noisy" if noisy else None),
                "rounds_side": judge(ratios, float(x), op == ">=", None),
            }
        )
    return out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", action="append", default=[], help="name=JSON overrides")
    parser.add_argument(
        "--code", action="append", default=[], help="name=commit: vllm_model as served there"
    )
    parser.add_argument("--with", dest="extra", action="append", default=[])
    parser.add_argument("--target", action="append", default=[])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--waves", type=int, default=2, help="requests per level = level × waves")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompt-words", type=int, default=40)
    parser.add_argument("--max-foreign-cpu-share", type=float, default=0.10)
    parser.add_argument("--settle-s", type=float, default=2.0, help="pause before each level")
    parser.add_argument("--ready-timeout-s", type=float, default=1800)
    parser.add_argument("--out", type=Path, default=REPO / "perf/results/vllm-settings")
    return parser.parse_args()


def short_commit(commit: str) -> str:
    """``commit`` (any name git knows) as its short hash, recorded with the results."""
    return subprocess.run(
        ["git", "rev-parse", "--short", commit],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def main() -> None:
    opts = parse_args()
    variants = dict((v.split("=", 1)[0], json.loads(v.split("=", 1)[1])) for v in opts.variant)
    commits = {
        name: short_commit(commit) for name, _, commit in (c.partition("=") for c in opts.code)
    }
    out_dir = new_run_dir(opts.out)
    env = server_environment()
    record: dict = {
        "environment": capture(
            Path(env["TRITONFORGE_MODELS"]) / "SmolLM2-135M-Instruct"
        ).model_dump(),
        "variants": variants,
        "code_variants": commits,
        # settings the server inherits that change what the engines run
        "environment_overrides": {k: os.environ[k] for k in ENGINE_ENVIRONMENT if k in os.environ},
        "idle_models": opts.extra,
        "settings": {k: v for k, v in vars(opts).items() if k not in ("variant", "out")},
    }
    with tempfile.TemporaryDirectory(prefix="vllm-settings-") as tmp:
        build_repository(Path(tmp), variants, opts.extra)
        for name, commit in commits.items():
            build_from_commit(Path(tmp), name, commit)
        models = [*variants, *commits, *opts.extra]
        started = time.monotonic()
        server = TritonServer.on_free_ports(
            models=models, repository=Path(tmp), log_path=out_dir / "server.log"
        )
        server.start()
        try:
            server.wait_ready(timeout_s=opts.ready_timeout_s)
            record["server_ready_s"] = round(time.monotonic() - started, 1)
            for name in [*variants, *commits]:  # warm-up: first requests pay one-off costs
                run_level(
                    server,
                    name,
                    2,
                    argparse.Namespace(**{**vars(opts), "waves": 1}),
                    random.Random(99),
                )
            record["rows"] = measure(server, [*variants, *commits], opts)
        finally:
            server.stop()
    record["targets"] = judge_targets(
        record["rows"], opts.target, opts.rounds, opts.max_foreign_cpu_share
    )
    (out_dir / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record["targets"], indent=1))
    print(f"wrote {out_dir / 'results.json'}")


if __name__ == "__main__":
    main()

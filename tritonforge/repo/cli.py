"""``python -m tritonforge.repo``: add a model to a repository, list it, check it."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from tritonforge.repo import engines
from tritonforge.repo.checks import ModelReport, check_repository
from tritonforge.repo.generate import AddError, AddRequest, add, engine_arg_value, parse_assignment
from tritonforge.repo.paths import server_environment

DEFAULT_REPOSITORY = Path("model_repository")

EPILOG = """\
examples:
  python -m tritonforge.repo add --engine vllm --model $TRITONFORGE_MODELS/SmolLM2-135M-Instruct \\
      --name smollm --engine-arg max_model_len=2048 --tokenizer-ensemble
  python -m tritonforge.repo add --engine llamacpp --model model.gguf --name smollm_gguf
  python -m tritonforge.repo check            # exit code 1 when a model has a problem
  python -m tritonforge.repo list

Paths under $TRITONFORGE_MODELS are written as $TRITONFORGE_MODELS/..., the wheel's GGUF
as $TRITONFORGE_GGUF, so the repository also works in a container (docker/, deploy/k8s/).
Checking vLLM engine arguments imports vLLM (tens of seconds on two cores).
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tritonforge.repo",
        description="Write and check Triton model repositories for tritonforge's engines.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    _add_subcommand(commands)
    _list_and_check_subcommands(commands)
    return parser


def _add_subcommand(commands: argparse._SubParsersAction) -> None:
    """``add``: write one model (and, on request, its tokenizer ensemble) into a repository."""
    adding = commands.add_parser(
        "add",
        help="write a model (config.pbtxt + engine settings) into a repository",
        description="Write config.pbtxt and 1/model.json (vllm, llamacpp) or 1/model.yaml "
        "(tensorrt_llm), checked before anything is moved into the repository.",
    )
    adding.add_argument("--engine", required=True, choices=sorted(engines.ENGINES))
    adding.add_argument(
        "--model",
        required=True,
        help="HF model directory (vllm, tensorrt_llm) or .gguf file (llamacpp); "
        "'$VAR/...' is kept as written",
    )
    adding.add_argument("--name", required=True, help="the model's name in Triton")
    adding.add_argument(
        "--instances", type=int, default=1, help="engine instances (each loads the model)"
    )
    adding.add_argument(
        "--max-inflight",
        type=int,
        help="requests in flight before 'busy' (default: vllm/tensorrt_llm 256, llamacpp 16)",
    )
    adding.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an engine argument for model.json/model.yaml (VALUE is JSON if it parses: "
        "2048, true, [1,2]); checked against the installed engine",
    )
    adding.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="vllm or llamacpp: a PEFT adapter directory, written to 1/multi_lora.json "
        "(upstream vllm_backend's format; vllm also gets enable_lora, llamacpp reads the "
        "adapter.gguf inside it); requests pick it with lora_name",
    )
    adding.add_argument(
        "--tokenizer-ensemble",
        action="store_true",
        help="also add <name>_preprocessing / <name>_postprocessing (C++ tokenizer) and "
        "ensemble_<name>",
    )
    adding.add_argument(
        "--tokenizer",
        help="tokenizer.json (or a directory holding it) for --tokenizer-ensemble "
        "(default: the model directory; required with llamacpp)",
    )
    adding.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    adding.add_argument("--force", action="store_true", help="replace models of the same name")


def _list_and_check_subcommands(commands: argparse._SubParsersAction) -> None:
    listing = commands.add_parser("list", help="models with engine, model, instances, checks")
    listing.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    listing.add_argument("--json", action="store_true", help="print JSON")

    checking = commands.add_parser(
        "check", help="check every model; exit code 1 when any has a problem"
    )
    checking.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    checking.add_argument("--json", action="store_true", help="print JSON")


def _as_dict(report: ModelReport) -> dict:
    return {
        "name": report.name,
        "kind": report.kind,
        "model": report.model,
        "instances": report.instances,
        "state": report.state,
        "errors": report.errors,
        "notes": report.notes,
    }


def _add(args: argparse.Namespace) -> int:
    try:
        engine_args = dict(
            (k, engine_arg_value(v))
            for k, v in (parse_assignment(a, "--engine-arg") for a in args.engine_arg)
        )
        loras = dict(parse_assignment(a, "--lora") for a in args.lora)
        request = AddRequest(
            engine=args.engine,
            model=args.model,
            name=args.name,
            repository=args.repository,
            instances=args.instances,
            max_inflight=args.max_inflight,
            engine_args=engine_args,
            loras=loras,
            tokenizer_ensemble=args.tokenizer_ensemble,
            tokenizer=args.tokenizer,
            force=args.force,
        )
        reports = add(request, server_environment(), engines.known_args)
    except AddError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for report in reports:
        print(f"wrote {args.repository / report.name} ({report.kind})")
        for note in report.notes:
            print(f"  note: {note}")
    names = " ".join(f"--load-model={r.name}" for r in reports)
    print(
        f"serve: tritonserver --model-repository={args.repository.resolve()} "
        f"--model-control-mode=explicit {names}"
    )
    return 0


def _table(reports: Sequence[ModelReport]) -> str:
    rows = [("NAME", "KIND", "MODEL", "INSTANCES", "CHECKS")]
    rows += [
        (r.name, r.kind, r.model or "-", "-" if r.instances is None else str(r.instances), r.state)
        for r in reports
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "add":
        return _add(args)
    reports = check_repository(args.repository, server_environment(), engines.known_args)
    failed = any(r.errors for r in reports)
    if args.json:
        print(json.dumps([_as_dict(r) for r in reports], indent=2))
    elif args.command == "list":
        print(_table(reports))
    else:
        for report in reports:
            print(f"{report.name} ({report.kind}): {report.state}")
            for error in report.errors:
                print(f"  - {error}")
            for note in report.notes:
                print(f"  note: {note}")
        print(
            f"{sum(bool(r.errors) for r in reports)} of {len(reports)} models have problems"
            if failed
            else f"all {len(reports)} models ok"
        )
    return 1 if args.command == "check" and failed else 0

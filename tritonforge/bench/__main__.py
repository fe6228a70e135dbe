"""Command line: ``python -m tritonforge.bench run --contract perf/contracts/smoke.yaml``.

``python -m tritonforge.bench soak`` runs the reliability suite (``make soak``),
``python -m tritonforge.bench storm`` the storm with a forced kill of tritonserver
(``make storm``, ``tritonforge.bench.reliability.kill_storm``);
``python -m tritonforge.bench run`` on a contract of ``kind: ceiling`` (or ``ceiling``
directly, e.g. ``--contract perf/contracts/serving-ceiling.yaml``) runs a serving-ceiling
contract (``tritonforge.bench.ceiling``), ``ab`` the same contract on
several commits in interleaved rounds (``tritonforge.bench.ab``), ``peers`` each Triton
model past saturation against its engine's own server (``tritonforge.bench.peers``),
``operability`` what running each candidate costs (``tritonforge.bench.operability``).
``exit-cost`` runs the application contract suite against one OpenAI-compatible
endpoint (``tritonforge.bench.exit_cost``), ``exit-cost-report`` compares a directory of
candidates pairwise, and ``decide`` writes a decision record from a contract run,
operability and exit-cost results (``tritonforge.bench.decision``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tritonforge.bench.contract import ContractError, load_contract
from tritonforge.bench.environment import ServedCodeMismatch


def _run(args: argparse.Namespace) -> int:
    from tritonforge.bench.ceiling import is_ceiling_contract
    from tritonforge.bench.runner import RESULTS_ROOT, run_contract

    if is_ceiling_contract(args.contract):
        return _ceiling(args)
    run_dir = run_contract(
        args.contract,
        args.set,
        Path(args.results or RESULTS_ROOT),
        allow_served_mismatch=args.allow_served_mismatch,
    )
    print(run_dir)
    return 0


def _validate(args: argparse.Namespace) -> int:
    from tritonforge.bench.ceiling import is_ceiling_contract, load_ceiling_contract

    if is_ceiling_contract(args.contract):
        ceiling = load_ceiling_contract(args.contract, args.set)
        print(f"{args.contract}: valid ({ceiling.name}, {len(ceiling.targets)} targets, ceiling)")
        return 0
    contract, digest = load_contract(args.contract, args.set)
    print(
        f"{args.contract}: valid ({contract.name}, {len(contract.targets)} targets, "
        f"sha256 {digest[:12]})"
    )
    return 0


def _plan(args: argparse.Namespace) -> int:
    from tritonforge.bench import planner
    from tritonforge.bench.services import load_engine_settings
    from tritonforge.launch.model_store import models_dir

    contract, _ = load_contract(args.contract, args.set)
    engine = load_engine_settings(args.engine_config) if args.engine_config else {}
    model_dir = Path(engine["model"]) if "model" in engine else models_dir() / contract.model
    kv_bytes = args.kv_cache_bytes or engine.get("kv_cache_memory_bytes")
    if not kv_bytes:
        raise ContractError(
            "no KV-cache size: pass --kv-cache-bytes or an engine config that sets it"
        )
    overrides = {
        "max_num_batched_tokens": args.token_budget,
        "long_prefill_token_threshold": args.long_prefill_threshold,
        "block_size": args.block_size,
    }
    engine |= {k: v for k, v in overrides.items() if v is not None}
    plan = planner.plan_contract(
        contract, planner.read_model_config(model_dir), int(kv_bytes), engine, args.iterations
    )
    print(plan.model_dump_json(indent=2) if args.json else planner.describe(plan))
    return 0


def _report(args: argparse.Namespace) -> int:
    from tritonforge.bench import report
    from tritonforge.bench.results import RunResult

    result = RunResult.model_validate_json((args.run_dir / "results.json").read_text())
    print(report.write(result, args.run_dir))
    return 0


def _soak(args: argparse.Namespace) -> int:
    from tritonforge.bench import soak

    return soak.main(args)


def _storm(args: argparse.Namespace) -> int:
    import shlex

    from tritonforge.bench.reliability import kill_storm

    def command() -> str:
        return shlex.join(["python", "-m", "tritonforge.bench", *sys.argv[1:]])

    return kill_storm.main(args, command)


def _ceiling(args: argparse.Namespace) -> int:
    from tritonforge.bench.ceiling import RESULTS_ROOT, run_ceiling

    root = Path(args.results or RESULTS_ROOT)
    print(run_ceiling(args.contract, args.set, root, args.allow_served_mismatch))
    return 0


def _add_ceiling(sub: argparse._SubParsersAction) -> None:
    ceiling = sub.add_parser(
        "ceiling",
        help="serving-ceiling contract: the serving path's own cost per token, engine removed",
    )
    _contract_args(ceiling)
    ceiling.add_argument("--results", help="results root (default perf/results)")
    _served_mismatch_arg(ceiling)
    ceiling.set_defaults(func=_ceiling)


def _ab(args: argparse.Namespace) -> int:
    from tritonforge.bench.ab import run_ab
    from tritonforge.bench.ceiling import RESULTS_ROOT

    out = run_ab(args.contract, args.commits, args.rounds, Path(args.results or RESULTS_ROOT))
    print(f"wrote {out}" if out else "nothing ran")
    return 0


def _add_ab(sub: argparse._SubParsersAction) -> None:
    ab = sub.add_parser(
        "ab",
        help="a serving-ceiling contract on several commits, rounds interleaved (a worktree each)",
    )
    ab.add_argument("commits", nargs="+", help="commits to serve, in the first round's order")
    ab.add_argument("--contract", type=Path, required=True, help="a serving-ceiling contract")
    ab.add_argument("--rounds", type=int, default=3)
    ab.add_argument("--results", help="results root (default perf/results)")
    ab.set_defaults(func=_ab)


def _overload(args: argparse.Namespace) -> int:
    from tritonforge.bench import overload

    try:
        return overload.main(args)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2


def _add_overload(sub: argparse._SubParsersAction) -> None:
    from tritonforge.bench.overload import add_arguments

    cells = sub.add_parser(
        "overload",
        help="an overload contract's cells: multiples of the saturation rate, admission on/off",
    )
    add_arguments(cells)
    cells.set_defaults(func=_overload)


def _overload_report(args: argparse.Namespace) -> int:
    from tritonforge.bench import overload_report

    return overload_report.main(args.run_dir)


def _peers(args: argparse.Namespace) -> int:
    from tritonforge.bench import peers

    try:
        return peers.main(args)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2


def _add_peers(sub: argparse._SubParsersAction) -> None:
    from tritonforge.bench.peers import add_arguments

    peers = sub.add_parser(
        "peers",
        help="past saturation, each Triton model against its engine's own server "
        "(vllm serve, llama.cpp's server), the same arrivals, rounds interleaved",
    )
    add_arguments(peers)
    peers.set_defaults(func=_peers)


def _operability(args: argparse.Namespace) -> int:
    from tritonforge.bench import operability

    return operability.main(args)


def _add_operability(sub: argparse._SubParsersAction) -> None:
    from tritonforge.bench.operability import add_arguments

    cmd = sub.add_parser(
        "operability",
        help="each candidate's engine killed under load, SIGTERM with requests in flight, "
        "its metrics and request ids",
    )
    add_arguments(cmd)
    cmd.set_defaults(func=_operability)


def _add_overload_report(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser("overload-report", help="verdicts of an overload run → verdicts.json")
    rep.add_argument("run_dir", type=Path)
    rep.set_defaults(func=_overload_report)


def _exit_cost(args: argparse.Namespace) -> int:
    from tritonforge.bench.exit_cost import run

    return run.run(args)


def _add_exit_cost(sub: argparse._SubParsersAction) -> None:
    from tritonforge.bench.exit_cost.run import add_arguments

    suite = sub.add_parser(
        "exit-cost",
        help="the application contract suite against one OpenAI-compatible endpoint",
    )
    add_arguments(suite)
    suite.set_defaults(func=_exit_cost)


def _exit_cost_report(args: argparse.Namespace) -> int:
    from tritonforge.bench.exit_cost import run

    return run.report(args)


def _add_exit_cost_report(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser(
        "exit-cost-report", help="what a move between each pair of candidates costs → report.md"
    )
    rep.add_argument("run_dir", type=Path)
    rep.set_defaults(func=_exit_cost_report)


def _decide(args: argparse.Namespace) -> int:
    from tritonforge.bench.decision import record

    return record.main(args)


def _add_decide(sub: argparse._SubParsersAction) -> None:
    from tritonforge.bench.decision.record import add_arguments

    decide = sub.add_parser(
        "decide",
        help="a decision record: goodput, operability and exit cost → the choice per track",
    )
    add_arguments(decide)
    decide.set_defaults(func=_decide)


def _contract_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--contract", type=Path, required=True, help="perf/contracts/<name>.yaml")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a contract field, e.g. --set load.requests_per_level=4 (repeatable)",
    )


def _served_mismatch_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-served-mismatch",
        action="store_true",
        help="run even though the serving venv imports tritonforge from another work tree "
        "than this one (the results say so)",
    )


def _add_run(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="start the targets, drive the load, write results + report")
    _contract_args(run)
    run.add_argument("--results", help="results root (default perf/results)")
    _served_mismatch_arg(run)
    run.set_defaults(func=_run)


def _add_validate(sub: argparse._SubParsersAction) -> None:
    validate = sub.add_parser("validate", help="check a contract without running it")
    _contract_args(validate)
    validate.set_defaults(func=_validate)


def _add_plan(sub: argparse._SubParsersAction) -> None:
    plan = sub.add_parser("plan", help="KV-cache capacity and per-iteration token split")
    _contract_args(plan)
    plan.add_argument(
        "--engine-config", type=Path, default=Path("model_repository/vllm_model/1/model.json")
    )
    plan.add_argument(
        "--kv-cache-bytes", type=int, help="default: kv_cache_memory_bytes of the engine config"
    )
    plan.add_argument(
        "--token-budget", type=int, help="max_num_batched_tokens (default: engine config or 2048)"
    )
    plan.add_argument(
        "--long-prefill-threshold", type=int, help="long_prefill_token_threshold (0 = none)"
    )
    plan.add_argument(
        "--block-size", type=int, help="KV block size (default: engine config or 128, vLLM CPU)"
    )
    plan.add_argument("--iterations", type=int, default=8, help="iterations of the burst to show")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(func=_plan)


def _add_report(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser("report", help="rebuild report.md and plots from a run's results.json")
    rep.add_argument("run_dir", type=Path)
    rep.set_defaults(func=_report)


def _add_soak(sub: argparse._SubParsersAction) -> None:
    soak = sub.add_parser(
        "soak",
        help="reliability suite: mixed load, cancellation storm, malformed requests, SIGTERM",
    )
    soak.add_argument("--minutes", type=float, default=5.0, help="mixed load duration")
    soak.add_argument(
        "--warmup-minutes", type=float, help="RSS baseline after this (default min(1, minutes/4))"
    )
    soak.add_argument("--concurrency", type=int, default=64)
    soak.add_argument(
        "--models", nargs="+", default=["vllm_model", "ensemble_vllm"], help="models under load"
    )
    soak.add_argument(
        "--engine-model",
        default="vllm_model",
        help="the vLLM model among --models: its engine metrics are read, it takes chat messages",
    )
    soak.add_argument("--cancel-streams", type=int, default=100)
    soak.add_argument("--malformed-examples", type=int, default=200)
    soak.add_argument("--sigterm-requests", type=int, help="in flight at SIGTERM (concurrency)")
    soak.add_argument("--seed", type=int, default=0, help="seeds the mixed load's choices")
    soak.add_argument("--results", help="results root (default perf/results/reliability)")
    _served_mismatch_arg(soak)
    soak.set_defaults(func=_soak)


def _add_storm(sub: argparse._SubParsersAction) -> None:
    storm = sub.add_parser(
        "storm",
        help="minutes of every request path with cancels and malformed requests, "
        "tritonserver SIGKILLed midway under the launcher (defaults: the committed run's)",
    )
    storm.add_argument("--minutes", type=float, help="default 10")
    storm.add_argument("--concurrency", type=int, help="default 128")
    storm.add_argument("--models", nargs="+", help="default vllm_model ensemble_vllm")
    storm.add_argument("--cancel-share", type=float, help="default 0.2")
    storm.add_argument("--malformed-share", type=float, help="default 0.05")
    storm.add_argument("--timeout-s", type=float, help="each request's deadline, default 600")
    storm.add_argument("--seed", type=int, help="default 0")
    storm.add_argument("--results", help="results root (default perf/results/reliability)")
    _served_mismatch_arg(storm)
    storm.set_defaults(func=_storm)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tritonforge.bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    adders = (
        _add_run,
        _add_validate,
        _add_plan,
        _add_report,
        _add_soak,
        _add_storm,
        _add_ceiling,
        _add_ab,
        _add_overload,
        _add_overload_report,
        _add_peers,
        _add_operability,
        _add_exit_cost,
        _add_exit_cost_report,
        _add_decide,
    )
    for add in adders:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ContractError, ServedCodeMismatch) as error:
        print(error, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

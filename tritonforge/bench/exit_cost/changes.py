"""What an application written against one candidate must change to run on another.

Derived only from the two candidates' recorded checks: a check that passed on the one
the application was written against (*from*) and not on the one it moves to (*to*) is a
feature to drop or rebuild; a check that passed on both with different behaviours is a
change in how the application is written (a token budget, an explicit parameter, a
dashboard query). A check the *from* side did not pass costs nothing to leave: the
application could not depend on it.
"""

from __future__ import annotations

from itertools import permutations
from typing import Any

from tritonforge.bench.exit_cost.checks import dashboard_families
from tritonforge.bench.exit_cost.results import CheckResult, SuiteResult

#: What an application relies on when a check passes, for the change's wording.
FEATURES = {
    "chat_template": "usage.prompt_tokens for chat messages",
    "default_max_tokens": "requests without max_tokens",
    "default_temperature": "requests without temperature",
    "stop_sequence": "stop sequences",
    "json_schema": "response_format json_schema",
    "tool_call": "named tool_choice calls",
    "stream_usage": "stream_options.include_usage",
    "adapter": "LoRA adapters named as the model",
    "metrics": "the Prometheus metrics its dashboards query",
}


def _signals(before: dict[str, Any], after: dict[str, Any]) -> str | None:
    """The dashboard queries to rewrite: each signal none of whose families the other
    side exports (extra families on the other side cost nothing)."""
    moves = []
    old, new = before.get("signals", {}), after.get("signals", {})
    for signal in sorted(old):
        a, b = dashboard_families(old[signal]), dashboard_families(new.get(signal, []))
        if a and not set(a) & set(b):
            moves.append(f"{signal}: {', '.join(a)} → {', '.join(b) or 'nothing'}")
    return "rewrite dashboard queries — " + "; ".join(moves) if moves else None


def behaviour_change(check: str, before: dict[str, Any], after: dict[str, Any]) -> str | None:
    """One sentence: the change a differing behaviour asks of the application; None when
    the difference costs nothing."""
    if check == "chat_template":
        a, b = before["prompt_tokens"], after["prompt_tokens"]
        return (
            f"the chat template counts {a} → {b} prompt tokens for the same messages "
            f"({b - a:+d}): recompute token budgets and context-length limits"
        )
    if check == "default_max_tokens":
        return (
            f"a request without max_tokens was {before['default_bound']}, now "
            f"{after['default_bound']}: send max_tokens on every request"
        )
    if check == "default_temperature":
        return (
            f"without temperature the answer was {before['default']}, now {after['default']}: "
            "send temperature (and top_p) on every request"
        )
    if check == "metrics":
        return _signals(before, after)
    moved = [k for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]
    shown = ", ".join(f"{k} {before.get(k)!r} → {after.get(k)!r}" for k in moved)
    return f"{FEATURES.get(check, check)} behave differently ({shown}): adapt the client's handling"


def change(check: str, old: CheckResult, new: CheckResult | None) -> str | None:
    """What moving costs for one check; None when nothing changes for the application."""
    if old.status != "passed":
        return None
    feature = FEATURES.get(check, check)
    if new is None or new.status == "not run":
        return f"{feature}: not measured on the target — check it before moving"
    if new.status != "passed":
        return f"{feature} {new.status} ({new.summary}): drop the dependency or rebuild it"
    if old.behaviour == new.behaviour:
        return None
    return behaviour_change(check, old.behaviour, new.behaviour)


def changes(old: SuiteResult, new: SuiteResult) -> list[tuple[str, str]]:
    """(check, change) for a move from ``old`` to ``new``, in the suite's check order."""
    out = []
    for check in old.checks:
        text = change(check.check, check, new.check(check.check))
        if text is not None:
            out.append((check.check, text))
    return out


def status_table(results: list[SuiteResult]) -> list[str]:
    """One row per check, one column per candidate: its status and summary."""
    names = [r.candidate for r in results]
    checks = list(dict.fromkeys(c.check for r in results for c in r.checks))
    lines = [
        "| check | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for check in checks:
        cells = []
        for r in results:
            found = r.check(check)
            cells.append("–" if found is None else f"{found.status}: {found.summary}")
        lines.append(f"| {check} | " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return lines


def pair_lines(results: list[SuiteResult]) -> list[str]:
    """Every ordered pair: the changes, or that none is needed."""
    lines: list[str] = []
    for old, new in permutations(results, 2):
        found = changes(old, new)
        lines += [f"### Written against {old.candidate}, moving to {new.candidate}", ""]
        if not found:
            lines += ["No change: every check that passed on the first behaves the same.", ""]
            continue
        lines += [f"- **{check}**: {text}" for check, text in found]
        lines.append("")
    return lines


def count_matrix(results: list[SuiteResult]) -> list[str]:
    """How many changes each move costs: rows written against, columns moving to."""
    names = [r.candidate for r in results]
    lines = ["| written against ↓ / moving to → | " + " | ".join(names) + " |"]
    lines.append("|---|" + "---:|" * len(names))
    for old in results:
        cells = ["–" if old is new else str(len(changes(old, new))) for new in results]
        lines.append(f"| {old.candidate} | " + " | ".join(cells) + " |")
    return lines


def report(results: list[SuiteResult]) -> str:
    """The exit-cost report of a run directory's candidates."""
    lines = [
        "# Exit cost between candidates",
        "",
        "Each candidate's OpenAI-compatible endpoint ran the same golden requests "
        "(`python -m tritonforge.bench exit-cost`); no check depends on a model's words. "
        "A move costs a change where a check that passed on the first candidate fails, is "
        "unsupported or behaves differently on the second.",
        "",
        "| candidate | model | endpoint | commit | run |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        commit = str(r.environment.get("git_commit", "–"))[:12]
        if r.environment.get("git_dirty"):
            commit += " (dirty: " + ", ".join(r.environment.get("dirty_files", [])) + ")"
        lines.append(f"| {r.candidate} | `{r.model}` | {r.base_url} | {commit} | {r.started_at} |")
    lines += ["", "## Checks", "", *status_table(results), "", "## Changes per move", ""]
    lines += [*count_matrix(results), "", *pair_lines(results)]
    return "\n".join(lines)

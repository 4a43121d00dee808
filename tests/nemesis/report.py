"""The soak's figures (one JSON object) and its timeline picture, from its :class:`Outcome`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.nemesis import checks
from tests.nemesis.soak import Injected, Outcome


def _by_kind(
    injected: Sequence[Injected], values: Sequence[float | None]
) -> tuple[dict[str, dict[str, float | None]], dict[str, int]]:
    """p50/p99 per fault kind of ``values`` (one per fault), and how many were None."""
    measured: dict[str, list[float]] = {}
    missing: dict[str, int] = {}
    for fault, value in zip(injected, values, strict=True):
        kind = fault.fault.kind
        if value is None:
            missing[kind] = missing.get(kind, 0) + 1
        else:
            measured.setdefault(kind, []).append(value)
    return {
        kind: {"p50": checks.percentile(v, 50), "p99": checks.percentile(v, 99)}
        for kind, v in sorted(measured.items())
    }, missing


def figures(outcome: Outcome, seed: int) -> dict[str, Any]:
    """The JSON figures of a soak."""
    injected = outcome.injected
    by_kind: dict[str, int] = {}
    for fault in injected:
        by_kind[fault.fault.kind] = by_kind.get(fault.fault.kind, 0) + 1
    heals = [i.heal for i in injected]
    recovery, unrecovered = _by_kind(injected, checks.recovery_times(heals, outcome.attempts))
    outage, _ = _by_kind(
        injected, checks.outages([(i.start, i.heal) for i in injected], outcome.attempts)
    )
    sinks, sinks_unrecovered = _by_kind(
        injected, checks.sink_recovery_times(heals, outcome.samples)
    )
    return {
        "benchmark": "nemesis",
        "seed": seed,
        "seconds": round(outcome.end - outcome.start, 1),
        "faults": by_kind,
        "faults_total": sum(by_kind.values()),
        "acknowledged_writes": outcome.appends.acknowledged,
        "attempted_writes": len(outcome.attempts),
        "lost": len(outcome.appends.lost),
        "duplicated": len(outcome.appends.duplicated),
        "out_of_order": len(outcome.appends.out_of_order),
        "diverged_servers": outcome.appends.diverged,
        "indeterminate_writes_committed": outcome.appends.indeterminate_committed,
        "write_recovery_after_heal_s": recovery,
        "write_outage_s": outage,
        "writes_unrecovered": unrecovered,
        "sink_recovery_after_heal_s": sinks,
        "sinks_unrecovered": sinks_unrecovered,
        "write_success_share": checks.write_availability(
            outcome.attempts, outcome.start, outcome.end
        ),
        "eo_pipeline": {
            "fed": outcome.eo_lines.expected,
            "delivered": outcome.eo_lines.delivered,
            "missing": len(outcome.eo_lines.missing),
            "duplicated": len(outcome.eo_lines.duplicated),
            "in_order": outcome.eo_in_order,
        },
        "directory_pipeline": {
            "fed": outcome.dir_rows.expected,
            "delivered": outcome.dir_rows.delivered,
            "missing": len(outcome.dir_rows.missing),
            "duplicated": len(outcome.dir_rows.duplicated),
        },
        "all_running_after_heal_s": outcome.running_after_s,
        "unexpected_deaths": len(outcome.unexpected_deaths),
        "problems": outcome.problems,
    }


def timeline_png(outcome: Outcome, path: Path) -> None:
    """Throughput against the faults: appends acknowledged per second, and the lines each
    sink holds, with each fault shaded over the time it lasted (the nemesis ends at the
    dashed line; what follows is the drain the checks wait for)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.patches
    import matplotlib.pyplot as plt

    start = outcome.start
    last = max([outcome.end, *(t for t, _, _ in outcome.samples)])
    acks = checks.acks_per_second(outcome.attempts, start, last)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(14, 7), sharex=True)
    top.plot(range(len(acks)), acks, color="tab:blue", linewidth=0.7)
    top.set_ylabel("appends acked / s")
    xs = [t - start for t, _, _ in outcome.samples]
    for column, label, color in (
        (1, "file → DirectorySink", "tab:green"),
        (2, "DirectorySource → file", "tab:orange"),
    ):
        bottom.plot(
            xs, [s[column] for s in outcome.samples], label=label, color=color, linewidth=1.0
        )
    bottom.set_ylabel("lines at the sink")
    bottom.set_xlabel("seconds since the nemesis began")
    bottom.legend(loc="upper left", fontsize=8)
    colors = matplotlib.colormaps["tab20"]
    kinds = sorted({i.fault.kind for i in outcome.injected})
    for injected in outcome.injected:
        shade = colors(kinds.index(injected.fault.kind) / max(1, len(kinds)))
        end = (injected.heal or outcome.end) - start
        for axis in (top, bottom):
            axis.axvspan(injected.start - start, end, color=shade, alpha=0.35, linewidth=0)
    handles = [
        matplotlib.patches.Patch(color=colors(i / max(1, len(kinds))), alpha=0.35, label=k)
        for i, k in enumerate(kinds)
    ]
    top.legend(handles=handles, loc="upper left", fontsize=7, ncol=min(6, len(kinds) or 1))
    for axis in (top, bottom):
        axis.axvline(outcome.end - start, color="black", linestyle="--", linewidth=0.8)
    top.set_title("nemesis: throughput against faults (shaded)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

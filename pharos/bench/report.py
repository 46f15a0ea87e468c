"""``pharos bench report DIR --out REPORT_DIR``: result files alone turned into ``report.md``
(per workload a table of policy × rate, medians over the seeds) and PNG charts of p99 TTFT and
goodput against offered load, with each workload's winner.

A policy wins p99 TTFT at a rate with the lowest median p99 among the runs that failed at most
``MAX_ERROR_SHARE`` of their requests (latency counts successes only, so dropping requests must
not win); it wins hit rate with the highest median. The workload's winner wins the most rates.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pharos.bench.result import read_result

#: Above this share of failed requests a run cannot win on latency.
MAX_ERROR_SHARE = 0.01


@dataclass(frozen=True)
class Row:
    """One policy at one rate of one workload: medians over its runs (seeds)."""

    workload: str
    policy: str
    rate: float
    runs: int
    p50_ttft: float | None
    p99_ttft: float | None
    p99_tpot: float | None
    goodput: float | None
    hit_rate: float | None
    busiest_share: float | None
    #: Failed requests and counted requests, summed over the runs.
    errors: int
    n: int

    @property
    def error_share(self) -> float:
        """Failed over counted requests."""
        return self.errors / self.n if self.n else 0.0


def load(root: Path) -> list[dict[str, Any]]:
    """Every result document under ``root``, in path order."""
    docs = []
    for path in sorted(root.rglob("*.json")):
        doc = read_result(path)
        if doc is not None:
            doc["_path"] = str(path.relative_to(root))
            docs.append(doc)
    return docs


def median(values: Iterable[float | None]) -> float | None:
    """The median of the known values, ``None`` when none is known."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def rows(docs: Iterable[dict[str, Any]]) -> list[Row]:
    """One row per workload, policy and rate, sorted by workload, policy, rate."""
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = defaultdict(list)
    for doc in docs:
        spec = doc["spec"]
        policy = spec.get("policy") or spec.get("dispatch") or "unnamed"
        groups[(spec["workload"], policy, float(spec["rate"]))].append(doc["summary"])
    out = []
    for (workload, policy, rate), sums in sorted(groups.items()):
        out.append(Row(
            workload=workload, policy=policy, rate=rate, runs=len(sums),
            p50_ttft=median(s["ttft_s"]["p50"] for s in sums),
            p99_ttft=median(s["ttft_s"]["p99"] for s in sums),
            p99_tpot=median(s["tpot_s"]["p99"] for s in sums),
            goodput=median(s.get("goodput_rps") for s in sums),
            hit_rate=median(s.get("hit_rate") for s in sums),
            busiest_share=median(s.get("busiest_share") for s in sums),
            errors=sum(sum(s.get("errors", {}).values()) for s in sums),
            n=sum(s.get("counted", 0) for s in sums),
        ))
    return out


@dataclass(frozen=True)
class Verdict:
    """Who wins a measure on one workload: per rate, and overall (most rates won)."""

    measure: str
    #: The best policy at each rate; ``None`` where several tie for best.
    by_rate: dict[float, str | None]
    overall: str | None

    def _at(self, policy: str | None) -> str:
        return ", ".join(f"{r:g}" for r, p in self.by_rate.items() if p == policy)

    def sentence(self) -> str:
        """One Markdown line."""
        if self.overall is None:
            if self.by_rate:
                return f"- **{self.measure}**: a tie at every rate."
            return f"- **{self.measure}**: unknown (no run reported it)."
        wins = Counter(p for p in self.by_rate.values() if p is not None)
        others = [f"{p} at {self._at(p)}" for p in sorted(wins) if p != self.overall]
        if None in self.by_rate.values():
            others.append(f"a tie at {self._at(None)}")
        tail = f"; {'; '.join(others)}" if others else ""
        return (f"- **{self.measure}**: {self.overall}, best at {wins[self.overall]} of "
                f"{len(self.by_rate)} rates ({self._at(self.overall)} req/s{tail}).")


def verdict(measure: str, workload_rows: Sequence[Row], key: str, lowest: bool) -> Verdict:
    """The winner of ``key`` (a ``Row`` field) at each rate and overall."""
    by_rate: dict[float, str | None] = {}
    for rate in sorted({r.rate for r in workload_rows}):
        at = [r for r in workload_rows if r.rate == rate and getattr(r, key) is not None]
        if key != "hit_rate":
            at = [r for r in at if r.error_share <= MAX_ERROR_SHARE] or at
        if not at:
            continue
        pick = min if lowest else max
        best = pick(getattr(r, key) for r in at)
        winners = [r.policy for r in at if getattr(r, key) == best]
        by_rate[rate] = winners[0] if len(winners) == 1 else None
    wins = Counter(p for p in by_rate.values() if p is not None)
    if not wins:
        return Verdict(measure, by_rate, None)
    top = max(wins.values())
    # several policies winning as many rates: the one that wins the highest rate of theirs
    tied = {p for p, n in wins.items() if n == top}
    overall = next(p for r in sorted(by_rate, reverse=True) if (p := by_rate[r]) in tied)
    return Verdict(measure, by_rate, overall)


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v * 1000:,.0f}"


def _num(v: float | None, fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def table(workload_rows: Sequence[Row]) -> list[str]:
    """The Markdown table of one workload."""
    out = ["| policy | rate | p50 TTFT ms | p99 TTFT ms | p99 TPOT ms | goodput req/s | "
           "hit rate | busiest share | errors | n | runs |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in sorted(workload_rows, key=lambda r: (r.policy, r.rate)):
        out.append(f"| {r.policy} | {r.rate:g} | {_ms(r.p50_ttft)} | {_ms(r.p99_ttft)} | "
                   f"{_ms(r.p99_tpot)} | {_num(r.goodput, '.2f')} | {_num(r.hit_rate, '.2f')} | "
                   f"{_num(r.busiest_share, '.2f')} | {r.errors} | {r.n} | {r.runs} |")
    return out


def charts(workload: str, workload_rows: Sequence[Row], out: Path) -> list[str]:
    """p99 TTFT and goodput against offered load, one line per policy; the file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    policies = sorted({r.policy for r in workload_rows})
    rates = sorted({r.rate for r in workload_rows})
    for key, label, fname in (("p99_ttft", "p99 TTFT (s)", f"{workload}-p99-ttft.png"),
                              ("goodput", "goodput (req/s)", f"{workload}-goodput.png")):
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
        for policy in policies:
            pts = sorted((r.rate, getattr(r, key)) for r in workload_rows
                         if r.policy == policy and getattr(r, key) is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy)
        if key == "goodput" and rates:
            ax.plot(rates, rates, linestyle="--", color="grey", linewidth=1, label="offered")
        ax.set_xlabel("offered load (req/s)")
        ax.set_ylabel(label)
        ax.set_title(f"{workload}: {label.split(' (')[0]} against offered load")
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / fname)
        plt.close(fig)
        names.append(fname)
    return names


def _setup(docs: Sequence[dict[str, Any]]) -> str:
    """What the runs of one workload had in common (or their ranges), in one line."""
    def values(get: Any) -> str:
        seen = sorted({str(get(d["spec"])) for d in docs})
        return seen[0] if len(seen) == 1 else " / ".join(seen)

    fleet = values(lambda s: _fleet(s.get("fleet")))
    commits = values(lambda s: (s.get("commit") or "unknown")[:10] + ("+" if s.get("dirty")
                                                                      else ""))
    return (f"duration {values(lambda s: s.get('duration'))} s, warm-up "
            f"{values(lambda s: s.get('warmup'))} s, seeds "
            f"{', '.join(sorted({str(d['spec'].get('seed')) for d in docs}))}, SLO TTFT "
            f"{values(lambda s: s.get('slo', {}).get('ttft_s'))} s and TPOT "
            f"{values(lambda s: s.get('slo', {}).get('tpot_s'))} s, workload arguments "
            f"{values(lambda s: s.get('workload_args') or 'default')}, fleet {fleet}; commits "
            f"{commits} (+: uncommitted changes)")


def _fleet(fleet: Any) -> str:
    if not isinstance(fleet, dict):
        return "as given (bench run)"
    args = " ".join(fleet.get("engine_args") or ()) or "default options"
    return f"{fleet.get('engines')} × {fleet.get('kind')} ({args})"


def render(docs: Sequence[dict[str, Any]], out: Path, source: str) -> str:
    """Write the charts into ``out``; the Markdown of the report."""
    all_rows = rows(docs)
    machines = sorted({f"{d['spec'].get('machine', {}).get('cpus')} CPUs, Python "
                       f"{d['spec'].get('machine', {}).get('python')}" for d in docs})
    dates = sorted(str(d["spec"].get("date", "?"))[:10] for d in docs)
    lines = [
        "# Benchmark report", "",
        f"{len(docs)} result files from `{source}`, {dates[0]} to {dates[-1]}"
        if docs else f"No result files in `{source}`.",
    ]
    if docs:
        lines[-1] += f", measured on {'; '.join(machines)}."
        lines += ["", "Medians over the runs (seeds) of each policy and rate; errors and n are "
                  "summed over them. Latencies count from each request's scheduled time and "
                  "cover successful requests; goodput counts requests meeting the SLO per "
                  "second; hit rate is cached over prompt tokens as the engines reported them "
                  "(– when they report none). A policy wins p99 TTFT at a rate with the lowest "
                  f"median among runs failing at most {MAX_ERROR_SHARE:.0%} of requests."]
    for workload in sorted({r.workload for r in all_rows}):
        wr = [r for r in all_rows if r.workload == workload]
        wdocs = [d for d in docs if d["spec"]["workload"] == workload]
        lines += ["", f"## {workload}", "", _setup(wdocs) + ".", ""]
        lines += [verdict("p99 TTFT", wr, "p99_ttft", lowest=True).sentence(),
                  verdict("hit rate", wr, "hit_rate", lowest=False).sentence(),
                  verdict("goodput", wr, "goodput", lowest=False).sentence(), ""]
        lines += table(wr)
        lines.append("")
        try:
            names = charts(workload, wr, out)
        except ImportError:
            names = []
            lines.append("(No charts: matplotlib is not installed; "
                         "`pip install pharos-router[bench]`.)")
        lines += [f"![{name}]({name})" for name in names]
    return "\n".join(lines) + "\n"


def main_report(argv: Sequence[str]) -> int:
    """``pharos bench report DIR --out REPORT_DIR``."""
    p = argparse.ArgumentParser(prog="pharos bench report",
                                description="Turn result files into report.md and charts.")
    p.add_argument("results", type=Path, help="directory of result files (searched deeply)")
    p.add_argument("--out", type=Path, required=True, help="directory for report.md and PNGs")
    a = p.parse_args(argv)
    docs = load(a.results)
    if not docs:
        print(f"pharos bench report: no result files under {a.results}")
        return 1
    a.out.mkdir(parents=True, exist_ok=True)
    text = render(docs, a.out, str(a.results))
    (a.out / "report.md").write_text(text)
    print(f"wrote {a.out / 'report.md'} ({len(docs)} result files)")
    return 0

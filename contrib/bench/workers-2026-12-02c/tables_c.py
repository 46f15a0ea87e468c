"""Markdown tables of a ``bench_workers_c.py`` result: ``python tables_c.py RESULT.json``."""

from __future__ import annotations

import json
import sys
from typing import Any


def median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def tables(r: dict[str, Any]) -> str:
    out = [f"{r['started']} - {r['ended']}, load average at start {r['loadavg_start']}, "
           f"at end {r['loadavg_end']}; args {r['args']}", ""]
    for close in (False, True):
        out += [f"### {'close (a new connection per request)' if close else 'keep-alive'}", "",
                "| variant | req/s by round | median | Pharos CPU ms/req | per process "
                "ms/req | nginx | wrk | p50 / p99 ms | engine conns/req | busy cores | "
                "other CPU s | load 1-min |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for v in ["nginx", *r["variants"]]:
            mine = [x for x in r["runs"] if x["variant"] == v and x["close"] == close]
            if not mine:
                continue
            keys = [k for k in mine[0]["cpu_ms_per_req"]
                    if k not in ("pharos", "nginx", "wrk")]
            per = ", ".join(f"{k} {fmt(median([x['cpu_ms_per_req'][k] for x in mine]), 3)}"
                            for k in keys) or "-"
            loads = [x["loadavg_before"][0] for x in mine]
            out.append(" | ".join([
                f"| {v}", ", ".join(f"{x['rps']:.0f}" for x in mine),
                fmt(median([x["rps"] for x in mine]), 0),
                fmt(median([x["cpu_ms_per_req"]["pharos"] for x in mine]), 3)
                if v != "nginx" else "-",
                per, fmt(median([x["cpu_ms_per_req"]["nginx"] for x in mine]), 3),
                fmt(median([x["cpu_ms_per_req"]["wrk"] for x in mine]), 3),
                f"{fmt(median([x['latency_ms']['p50'] for x in mine]), 1)} / "
                f"{fmt(median([x['latency_ms']['p99'] for x in mine]), 1)}",
                fmt(median([x["engine_conns_per_req"] for x in mine]), 3),
                fmt(median([x["machine_busy_cores"] for x in mine]), 2),
                ", ".join(f"{x['other_cpu_s']:.2f}" for x in mine),
                f"{min(loads):.2f}-{max(loads):.2f} |"]))
        out.append("")
        conn = "close" if close else "keepalive"
        for k, v in r["summary"][conn].items():
            if k.startswith("ratio_"):
                out.append(f"- {k[6:].replace('_over_', ' / ')}: by round "
                           f"{', '.join(f'{x:.2f}' for x in v['by_round'])}; "
                           f"median **{fmt(v['median'])}**")
        out.append("")
        held = [(x["variant"], x["conns_held"]) for x in r["runs"]
                if x["close"] == close and x.get("conns_held")]
        if held:
            out.append("Connections held per process midway: " + "; ".join(
                f"{v} {':'.join(str(n) for n in h.values() if n)}" for v, h in held))
            out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(tables(json.load(f)))

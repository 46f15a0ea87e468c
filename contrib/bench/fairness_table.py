"""The tables of contrib/bench/fairness.sh's results: python3 fairness_table.py OUT_DIR.

(a) the light key's p95 TTFT per seed and mode, and its ratio to the light key alone; (b) what
each client group was served per second (requests, output tokens) and group b's share of the
served output tokens, per seed and mode. Figures are read from each result file's summary
(``per_client``): requests scheduled in the warm-up are left out, and a request counts as served
when its whole stream arrived before its timeout.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def results(out: Path, mode: str) -> dict[tuple[str, int], dict[str, Any]]:
    """(policy, seed) -> summary of every result file under OUT/MODE."""
    found = {}
    for path in sorted((out / mode).glob("*/*/*-seed*.json")):
        doc = json.loads(path.read_text())
        found[(doc["spec"]["policy"], doc["spec"]["seed"])] = doc
    return found


def ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def table_a(out: Path) -> list[str]:
    modes = [("a-alone", "cost", "light alone"), ("a-fair", "cost", "fair queue, 2 keys"),
             ("a-onekey", "cost", "one key (FIFO)"),
             ("a-fair", "round-robin", "round robin to engines")]
    docs = {m: results(out, m) for m, _, _ in modes}
    seeds = sorted({s for d in docs.values() for _, s in d})
    lines = ["| run | " + " | ".join(f"seed {s}" for s in seeds) + " | median |",
             "| --- |" + " --- |" * (len(seeds) + 1)]
    alone = {s: _light(docs["a-alone"].get(("cost", s))) for s in seeds}
    for mode, policy, label in modes:
        cells, ratios = [], []
        for s in seeds:
            light = _light(docs[mode].get((policy, s)))
            if light is None:
                cells.append("-")
                continue
            p95 = light["ttft_s"]["p95"]
            alone_s = alone[s]
            base = alone_s["ttft_s"]["p95"] if alone_s else None
            ratio = p95 / base if p95 is not None and base else None
            served = f"{light['ok']}/{light['counted']}"
            cells.append(f"{ms(p95)} ms" + (f" ({ratio:.2f}x)" if mode != "a-alone" and ratio
                                             else "") + f", {served}")
            if ratio is not None:
                ratios.append(ratio)
        med = f"{statistics.median(ratios):.2f}x" if ratios and mode != "a-alone" else ""
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {med} |")
    lines.append("")
    lines.append("Light key p95 TTFT (its ratio to light alone, same seed), light requests "
                 "served / counted.")
    lines.append("")
    lines.append("| run | seed | light p50 / p95 / p99 TTFT ms | heavy served req/s | "
                 "heavy p50 TTFT ms | fleet served req/s | errors |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- |")
    for mode, policy, label in modes:
        for s in seeds:
            doc = docs[mode].get((policy, s))
            if doc is None:
                continue
            pc = doc["summary"]["per_client"]
            light, heavy = pc.get("light"), pc.get("heavy")
            t = light["ttft_s"] if light else {}
            lines.append(
                f"| {label} | {s} | {ms(t.get('p50'))} / {ms(t.get('p95'))} / "
                f"{ms(t.get('p99'))} | "
                f"{heavy['throughput_rps']:.2f} | {ms(heavy['ttft_s']['p50'])} | " if heavy else
                f"| {label} | {s} | {ms(t.get('p50'))} / {ms(t.get('p95'))} / "
                f"{ms(t.get('p99'))} | - | - | ")
            lines[-1] += (f"{doc['summary']['throughput_rps']:.2f} | "
                          f"{sum(doc['summary']['errors'].values())} |")
    return lines


def journal_ttft(out: Path, mode: str, policy: str, seed: int, key: str
                 ) -> tuple[float | None, float | None]:
    """p50 and p95 of the engine-leg time to first byte (Pharos's usage journal: from the
    request's send to the engine to the engine's first byte, the role chunk) of ``key``'s
    served requests, or Nones without a journal."""
    path = out / mode / "logs" / "w6"
    found = list(path.glob(f"*/{policy}-seed{seed}/journal.jsonl"))
    if not found:
        return None, None
    values = sorted(
        doc["ttft_ms"] / 1000 for line in found[0].read_text().splitlines()
        if (doc := json.loads(line))["key"] == key and doc.get("ttft_ms") is not None)
    if not values:
        return None, None

    def pct(p: float) -> float:
        return values[max(0, min(len(values) - 1, int(-(-len(values) * p // 100)) - 1))]
    return pct(50), pct(95)


def table_engine(out: Path) -> list[str]:
    """The light key's engine-leg first byte (from Pharos's journal) against its client TTFT:
    the difference is the wait in Pharos (plus one decode step, role chunk to first token)."""
    lines = ["| run | seed | light client TTFT p50 / p95 ms | light engine-leg first byte "
             "p50 / p95 ms (journal) |", "| --- | --- | --- | --- |"]
    for mode, label, key in (("a-alone", "light alone", "light"),
                             ("a-fair", "fair queue, 2 keys", "light"),
                             ("a-onekey", "one key (FIFO)", "shared")):
        docs = results(out, mode)
        for (pol, s), doc in sorted(docs.items(), key=lambda kv: kv[0][1]):
            if pol != "cost":
                continue
            t = doc["summary"]["per_client"]["light"]["ttft_s"]
            e50, e95 = journal_ttft(out, mode, "cost", s, key)
            note = " (all keys: the journal cannot tell light from heavy)" \
                if key == "shared" else ""
            lines.append(f"| {label} | {s} | {ms(t['p50'])} / {ms(t['p95'])} | "
                         f"{ms(e50)} / {ms(e95)}{note} |")
    return lines


def _light(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if doc is None else doc["summary"].get("per_client", {}).get("light")


def table_b(out: Path) -> list[str]:
    modes = [("b-tenants", "cost", "two tenants (fair)"),
             ("b-keys", "cost", "101 keys, one tenant"),
             ("b-onekey", "cost", "one key (FIFO)"),
             ("b-tenants", "round-robin", "round robin to engines")]
    lines = ["| run | seed | a (100 keys) served req/s, tok/s | b (1 key) served req/s, "
             "tok/s | b's share of served tokens | a / b tokens | b p50 / p95 TTFT ms | "
             "timeouts (cut mid-stream) | started a / b |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    medians: dict[str, list[float]] = {}
    for mode, policy, label in modes:
        docs = results(out, mode)
        for (pol, s), doc in sorted(docs.items(), key=lambda kv: kv[0][1]):
            if pol != policy:
                continue
            pc = doc["summary"]["per_client"]
            a, b = pc["a"], pc["b"]
            ta, tb = a["output_tokens_per_s"], b["output_tokens_per_s"]
            share = tb / (ta + tb) if ta + tb else None
            medians.setdefault(label, []).append(ta / tb if tb else float("inf"))
            lines.append(
                f"| {label} | {s} | {a['throughput_rps']:.2f}, {ta:.0f} | "
                f"{b['throughput_rps']:.2f}, {tb:.0f} | "
                f"{'-' if share is None else f'{share:.3f}'} | "
                f"{ta / tb if tb else float('inf'):.2f} | "
                f"{ms(b['ttft_s']['p50'])} / {ms(b['ttft_s']['p95'])} | "
                f"{_timeouts(doc)} | {_started(doc, 'a')} / {_started(doc, 'b')} |")
    lines.append("")
    lines += [f"- {label}: median a / b served tokens {statistics.median(v):.2f}"
              for label, v in medians.items()]
    return lines


def _timeouts(doc: dict[str, Any]) -> str:
    """Counted requests that timed out, and how many of them had their first token already
    (cut mid-stream: engine work spent for nothing)."""
    late = [r for r in doc["records"] if not r["warmup"] and r["error"] == "timeout"]
    return f"{len(late)} ({sum(1 for r in late if r['ttft'] is not None)})"


def _started(doc: dict[str, Any], client: str) -> int:
    """Counted requests of ``client`` that got a slot and a first token (served whole, or cut
    mid-stream by the timeout): the fair queue's grants as the client saw them."""
    return sum(1 for r in doc["records"] if not r["warmup"] and r["client"] == client
               and r["ttft"] is not None)


def main() -> None:
    out = Path(sys.argv[1])
    print("## (a) 10:1 load\n")
    print("\n".join(table_a(out)))
    print("\n### Where the light key's time goes\n")
    print("\n".join(table_engine(out)))
    print("\n## (b) 100 keys of tenant a against 1 key of tenant b\n")
    print("\n".join(table_b(out)))


if __name__ == "__main__":
    main()

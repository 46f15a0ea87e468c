"""The benchmark summary math on synthetic records: percentiles, goodput, hit rate, warm-up
exclusion, per-engine shares, errors; and the report's medians and verdicts."""

from __future__ import annotations

from typing import Any

import pytest

from pharos.bench.openloop import assign
from pharos.bench.records import TIMEOUT, RequestRecord
from pharos.bench.report import Row, median, rows, verdict
from pharos.bench.run import workload_args
from pharos.bench.summary import Slo, distribution, hit_rate, percentile, summarize
from pharos.bench.workloads import Request


def rec(i: int, at: float = 1.0, *, ttft: float | None = 0.5, tpot: float | None = 0.05,
        completion: int | None = 10, prompt: int | None = 100, cached: int | None = 50,
        engine: str | None = "a", status: int | None = 200, error: str | None = None,
        warmup: bool = False, lag: float | None = 0.001) -> RequestRecord:
    return RequestRecord(index=i, at=at, tag="w1", model="tiny", max_tokens=10, warmup=warmup,
                         engine=engine, status=status, error=error, ttft=ttft, tpot=tpot,
                         e2e=None if ttft is None else ttft + 1.0, prompt_tokens=prompt,
                         cached_tokens=cached, completion_tokens=completion, lag=lag)


def test_percentile_is_nearest_rank() -> None:
    """p50/p90/p99 of 1..100 are 50, 90, 99; of one value, that value; of none, None."""
    values = [float(v) for v in range(100, 0, -1)]
    assert [percentile(values, p) for p in (50, 90, 99, 100)] == [50.0, 90.0, 99.0, 100.0]
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0], 50) == 1.0 and percentile([1.0, 2.0], 51) == 2.0


def test_distribution_skips_unknown_values() -> None:
    """Unknown values are left out, not counted as 0; no values at all give None stats."""
    d = distribution([None, 2.0, 4.0])
    assert d["n"] == 2 and d["mean"] == 3.0 and d["max"] == 4.0 and d["p50"] == 2.0
    assert distribution([None])["p99"] is None


def test_goodput_counts_requests_meeting_both_bounds_per_second_of_window() -> None:
    """Goodput is requests meeting TTFT and TPOT bounds over duration - warmup; a failed
    request, a slow first token or slow tokens do not count; one-token replies need no TPOT."""
    records = [
        rec(0),                                   # good
        rec(1, ttft=2.5),                         # first token too late
        rec(2, tpot=0.2),                         # tokens too slow
        rec(3, completion=1, tpot=None),          # one token: no TPOT, good
        rec(4, error=TIMEOUT, status=None),       # failed
        rec(5, completion=None, tpot=None),       # usage unknown: cannot show TPOT
    ]
    s = summarize(records, duration=12.0, warmup=2.0, slo=Slo(ttft=2.0, tpot=0.1))
    assert s["goodput_rps"] == pytest.approx(2 / 10)
    assert s["throughput_rps"] == pytest.approx(5 / 10)
    assert s["slo_attainment"] == pytest.approx(2 / 6)
    assert s["errors"] == {"timeout": 1}


def test_hit_rate_sums_tokens_over_requests_that_report_both() -> None:
    """Hit rate is sum cached / sum prompt (not a mean of ratios), skipping requests whose
    cached count is unknown; None when no request reports one (Ollama)."""
    records = [rec(0, prompt=100, cached=100), rec(1, prompt=300, cached=0),
               rec(2, prompt=1000, cached=None)]
    assert hit_rate(records) == pytest.approx(100 / 400)
    assert hit_rate([rec(0, cached=None)]) is None
    assert summarize([rec(0, cached=None)], 10.0)["hit_rate"] is None


def test_warmup_requests_are_sent_but_not_counted() -> None:
    """Warm-up records are in the totals but not in latencies, errors, hit rate or shares."""
    records = [rec(0, at=0.5, warmup=True, ttft=9.0, engine="b", error=TIMEOUT, cached=0),
               rec(1, at=3.0), rec(2, at=4.0)]
    s = summarize(records, duration=10.0, warmup=2.0)
    assert s["requests"] == 3 and s["warmup_requests"] == 1 and s["counted"] == 2
    assert s["ttft_s"]["max"] == 0.5
    assert s["errors"] == {}
    assert s["per_engine"] == {"a": 2}
    assert s["hit_rate"] == pytest.approx(0.5)
    assert s["window_s"] == 8.0


def test_per_engine_counts_and_busiest_share() -> None:
    """Requests per engine count every counted request whose engine is known, failed ones
    too; the busiest engine's share is its count over those."""
    records = [rec(0, engine="a"), rec(1, engine="a"), rec(2, engine="b"),
               rec(3, engine="a", status=503, error="http_503"),
               rec(4, engine=None, error="refused", status=None)]
    s = summarize(records, 10.0)
    assert s["per_engine"] == {"a": 3, "b": 1}
    assert s["busiest_share"] == pytest.approx(0.75)
    assert s["errors"] == {"http_503": 1, "refused": 1}
    assert summarize([], 10.0)["busiest_share"] is None


def test_send_lag_covers_counted_requests() -> None:
    """Send lag is summarized over every counted request, failed ones included."""
    records = [rec(0, lag=0.001), rec(1, lag=0.5, error="refused", status=None)]
    assert summarize(records, 10.0)["send_lag_s"]["max"] == 0.5


def _reqs(n: int, prompts: list[str] | None = None) -> list[Request]:
    prompts = prompts or ["x"]
    return [Request(i * 0.1, "m", ({"role": "user", "content": prompts[i % len(prompts)]},), 8)
            for i in range(n)]


def test_dispatch_is_deterministic() -> None:
    """Round robin cycles by request index; random is the same for the same seed only."""
    assert assign(["a", "b", "c"], _reqs(5), "round-robin", 1) == ["a", "b", "c", "a", "b"]
    first = assign(["a", "b", "c"], _reqs(50), "random", 7)
    assert first == assign(["a", "b", "c"], _reqs(50), "random", 7)
    assert first != assign(["a", "b", "c"], _reqs(50), "random", 8)
    assert set(first) == {"a", "b", "c"}


def test_prefix_aware_pins_each_prompt_to_its_first_engine() -> None:
    """production-stack's prefixaware: a prompt seen before goes where its longest recorded
    prefix went (a random one of those), load ignored; a new prompt to a random engine; the
    same seed makes the same choices."""
    shared = ["S" * 300 + f" question {i}" for i in range(3)]
    other = ["T" * 300 + f" question {i}" for i in range(3)]
    reqs = _reqs(60, [shared[0], other[0], shared[1], other[1], shared[2], other[2]])
    urls = ["a", "b", "c", "d"]
    out = assign(urls, reqs, "prefix-aware", 3)
    assert out == assign(urls, reqs, "prefix-aware", 3)
    assert len(set(out[0::2])) == 1  # every "S" prompt follows the first one
    assert len(set(out[1::2])) == 1
    # Over seeds, the first engine of a prompt is drawn from all of them.
    firsts = {assign(urls, reqs, "prefix-aware", seed)[0] for seed in range(40)}
    assert firsts == set(urls)


def test_prefix_aware_follows_the_matching_prompt() -> None:
    """Each prompt follows the engine that got its own prefix, not the other prompt's."""
    def req(at: float, text: str) -> Request:
        return Request(at, "m", ({"role": "user", "content": text},), 8)

    reqs = [req(0.0, "A" * 256), req(0.1, "B" * 256), req(0.2, "A" * 256 + "?"),
            req(0.3, "B" * 256 + "!")]
    split = 0
    for seed in range(30):
        out = assign(["a", "b", "c"], reqs, "prefix-aware", seed)
        assert (out[2], out[3]) == (out[0], out[1])
        split += out[0] != out[1]
    assert split  # the two prompts did land apart on some seeds


def test_workload_arguments_parse_as_json_or_strings() -> None:
    """KEY=VALUE pairs become generator keywords: JSON numbers, lists as ranges, strings."""
    assert workload_args(["cv=4", "arrivals=gamma", "prompt-tokens=[50,100]"]) == {
        "cv": 4, "arrivals": "gamma", "prompt_tokens": (50, 100)}
    with pytest.raises(ValueError):
        workload_args(["novalue"])


def summary_doc(policy: str, rate: float, seed: int, p99: float | None, hit: float | None,
                errors: int = 0, counted: int = 100) -> dict[str, Any]:
    ttft = {"p50": p99 and p99 / 2, "p99": p99}
    return {"spec": {"workload": "w1", "policy": policy, "rate": rate, "seed": seed},
            "summary": {"ttft_s": ttft, "tpot_s": {"p99": 0.05}, "goodput_rps": rate,
                        "hit_rate": hit, "busiest_share": 0.5, "counted": counted,
                        "errors": {"timeout": errors} if errors else {}}}


def test_report_rows_are_medians_over_seeds() -> None:
    """A row's figures are medians over the seeds; errors and n are sums."""
    docs = [summary_doc("cost", 2, s, p99, 0.8, errors=1) for s, p99 in ((1, 1.0), (2, 3.0),
                                                                           (3, 2.0))]
    (row,) = rows(docs)
    assert row.p99_ttft == 2.0 and row.runs == 3 and row.errors == 3 and row.n == 300
    assert median([None, 1.0, 3.0]) == 2.0 and median([None]) is None


def test_verdict_picks_lowest_p99_and_highest_hit_rate_per_rate() -> None:
    """p99 TTFT goes to the lowest at each rate, hit rate to the highest; the workload's
    winner wins the most rates; a run failing more than 1% of requests cannot win latency;
    equal values are a tie."""
    docs = [
        summary_doc("cost", 2, 1, 0.5, 0.9), summary_doc("least-load", 2, 1, 0.8, 0.4),
        summary_doc("cost", 4, 1, 0.7, 0.9), summary_doc("least-load", 4, 1, 0.9, 0.4),
        summary_doc("cost", 8, 1, 5.0, 0.6), summary_doc("least-load", 8, 1, 3.0, 0.6),
        summary_doc("random", 8, 1, 0.1, None, errors=50),
    ]
    table: list[Row] = rows(docs)
    p99 = verdict("p99 TTFT", table, "p99_ttft", lowest=True)
    assert p99.by_rate == {2: "cost", 4: "cost", 8: "least-load"}
    assert p99.overall == "cost"
    assert "best at 2 of 3 rates" in p99.sentence()
    hits = verdict("hit rate", table, "hit_rate", lowest=False)
    assert hits.by_rate == {2: "cost", 4: "cost", 8: None}
    assert hits.overall == "cost" and "a tie at 8" in hits.sentence()
    unknown = verdict("hit rate", [r for r in table if r.policy == "random"], "hit_rate", False)
    assert unknown.overall is None and "unknown" in unknown.sentence()

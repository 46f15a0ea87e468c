"""The one-metric parse reads exactly what the whole-page parse reads, on every captured
metrics page: the scrape's shortcut never changes a value."""

from __future__ import annotations

import pytest

from pharos.engine.capture import Capture
from pharos.engine.probes import ProbeError, prom_samples, prom_series
from tests.support.captures import all_captures, capture_id

PAGES = [(c, path) for c in all_captures() for path, rec in c.paths.items()
         if "metrics" in path and rec.status == 200 and rec.body]


@pytest.mark.parametrize(("capture", "path"), PAGES,
                         ids=[f"{capture_id(c)}{p}" for c, p in PAGES])
def test_every_metric_of_every_page_reads_the_same(capture: Capture, path: str) -> None:
    """For every sample name on a captured page, ``prom_series`` gives the samples (labels,
    values, order) the whole-page parse gives; a name the page lacks gives none."""
    body = capture.paths[path].body
    whole = prom_samples(body)
    assert whole, "a metrics page with no samples proves nothing"
    for name, samples in whole.items():
        assert prom_series(body, name) == samples, name
    assert prom_series(body, "pharos_no_such_metric") == ()


def test_a_name_that_prefixes_another_reads_only_its_own_lines() -> None:
    """``x`` does not pick up ``x_total`` or ``x_bucket`` lines, and a malformed line of the
    metric read is a parse error while one of another metric is not read at all."""
    body = (b"# TYPE x gauge\nx{m=\"a\"} 1\nx_total 5\nx_bucket{le=\"1\"} 2\nx 3\n"
            b"y{m=\"a\" 4\n")
    assert prom_series(body, "x") == (({"m": "a"}, 1.0), ({}, 3.0))
    assert prom_series(body, "x_total") == (({}, 5.0),)
    with pytest.raises(ProbeError):
        prom_series(body, "y")

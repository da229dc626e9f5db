"""Reading a Prometheus ``/metrics`` page in tests: every sample by name and labels, and what moved."""

from __future__ import annotations

from collections.abc import Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Samples", "changes", "parse", "sample_names", "scrape", "total"]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
"""Sample values by (sample name, label pairs)."""


def scrape(url: str) -> Samples:
    """GET ``url`` (a ``/metrics`` page) and parse it; fails the test unless it answers 200."""
    response = httpx.get(url, timeout=10.0)
    assert response.status_code == 200, (url, response.status_code, response.text[:500])
    return parse(response.text)


def parse(text: str) -> Samples:
    """Every sample of a Prometheus text page."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample_names(samples: Samples) -> set[str]:
    """The sample names on a page (``aptix_step_seconds_bucket``, ``aptix_turns_finished_total``, ...)."""
    return {name for name, _ in samples}


def changes(before: Samples, after: Samples) -> Samples:
    """The samples whose value differs, by how much (a sample new in ``after`` counts from 0)."""
    moved = {key: value - before.get(key, 0.0) for key, value in after.items()}
    return {key: value for key, value in moved.items() if value}


def total(samples: Samples, name: str, labels: Mapping[str, str] | None = None) -> float:
    """The sum of the ``name`` samples whose labels include ``labels``."""
    wanted = set((labels or {}).items())
    return sum(value for (sample, pairs), value in samples.items() if sample == name and wanted <= pairs)

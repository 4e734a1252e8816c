"""Scraping /metrics and reading it back with the client library's own parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return response.read().decode("utf-8")


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, {label: value}): value} of an exposition text."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(found: dict, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))

"""The exporter's series table (exporter/specwatch/exporter/series.py): one row per served family."""

from __future__ import annotations

from specwatch.exporter.series import COUNTER, GAUGE, SERIES


def test_every_row_is_its_own_family():
    """A duplicated name or attr would overwrite another family of the scrape (``_Families``)."""
    assert len({s.name for s in SERIES}) == len({s.attr for s in SERIES}) == len(SERIES)
    assert all(s.name.startswith("specwatch_") and s.kind in (GAUGE, COUNTER) and s.help for s in SERIES)
    assert all(s.valid is None or s.valid[0] < s.valid[1] for s in SERIES)

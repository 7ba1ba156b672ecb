"""The result documents are read through their records: no specwatch module calls the
deprecated dict reader ``resultfile.load_result``, and none reads a result document by key
outside its record module (docs/architecture.md, "Result-file contracts")."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "exporter" / "specwatch"
RECORD_MODULES = {"common/records.py", "bench/records.py", "choosek/records.py", "demo/records.py",
                  "bench/equivalence.py"}  # the last makes the greedy-output check's document (bench.records.Equivalence reads it)


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        yield rel, path.read_text(encoding="utf-8")


def test_no_module_calls_the_deprecated_dict_reader():
    users = [rel for rel, text in _sources() if rel != "choosek/resultfile.py" and "load_result" in text]
    assert not users, users


#: Keys of the sweep, bench and demo documents that only their record modules may spell as a subscript.
DOCUMENT_KEYS = ("cells", "summary", "batches", "configs", "servers", "settings", "comparison", "per_position",
                 "spec_decode_acceptance_rate", "output_throughput", "exporter_cost_profile", "specwatch_sweep_format",
                 "specwatch_bench_format", "specwatch_demo_format", "matched", "prompts", "identical")


def test_no_result_document_is_read_by_key_outside_its_record_module():
    # a read: doc["cells"], doc.get("cells") (an assignment d["batches"] = … builds another document)
    pattern = re.compile(r"""(\[\s*["'](%s)["']\s*\](?!\s*=[^=]))|\.get\(\s*["'](%s)["']""" % (("|".join(DOCUMENT_KEYS),) * 2))
    found = [f"{rel}:{i}: {line.strip()}" for rel, text in _sources() if rel not in RECORD_MODULES
             for i, line in enumerate(text.splitlines(), 1) if pattern.search(line)]
    assert not found, "\n".join(found)

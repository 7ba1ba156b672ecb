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


SCRIPTS = PACKAGE.parents[1] / "scripts"
#: Documents of other formats that scripts read by key: the receiver names per script, with what they are.
SCRIPT_DOCUMENTS = {
    "bench_client.py": {"d", "o", "v"},  # vLLM's own `vllm bench serve` result, and this script's rows of it
    "verify_speedup.py": {"out", "c", "cov", "cal", "doc"},  # its own verify document (cells it measured)
}


def test_no_script_reads_a_result_document_by_key():
    """Issue #39: scripts read sweep, bench and demo documents through their records too, as the
    package does (test_no_result_document_is_read_by_key_outside_its_record_module)."""
    pattern = re.compile(r"""(\w+)(?:\[\s*["'](%s)["']\s*\](?!\s*=[^=])|\.get\(\s*["'](%s)["'])""" % (("|".join(DOCUMENT_KEYS),) * 2))
    found = []
    for path in sorted(SCRIPTS.glob("*.py")):
        allowed = SCRIPT_DOCUMENTS.get(path.name, set())
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"scripts/{path.name}:{i}: {line.strip()}" for m in pattern.finditer(line) if m.group(1) not in allowed]
    assert not found, "\n".join(found)


def test_no_reader_takes_a_record_or_a_dict():
    """Issue #39: the readers take records only: no ``coerce`` and no ``load_result`` left in the
    package or the scripts (a test edits a document into a variant and reads it into its record
    at its own edge, tests/support/records.py)."""
    found = [f"{rel}:{i}: {line.strip()}" for rel, text in [*_sources(), *((f"scripts/{p.name}", p.read_text(encoding="utf-8"))
                                                                       for p in sorted(SCRIPTS.glob("*.py")))]
             for i, line in enumerate(text.splitlines(), 1) if "coerce(" in line or "load_result" in line]
    assert not found, "\n".join(found)

"""The bench writer builds its records (:mod:`specwatch.bench.records`) and writes their
``to_json``: its files are byte for byte those of the writer that built dicts by key.

The expected files (``tests/fixtures/bench-writer/``) were written by the dict-building writer
(main at 4d58092) from the inputs :func:`build_batches` makes; ``python tests/unit/test_records_writer.py
DIR`` writes them again with the current code (the same inputs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specwatch.bench.records import BenchBatch, BenchCell, BenchResult, Equivalence
from specwatch.bench.results import BatchResult, CellSummary, ResultWriter, SpecDecodeStats
from specwatch.specdecode.metrics import SpecDecodeCounters, StepCounters

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EXPECTED = FIXTURES / "bench-writer"
PERREQUEST = FIXTURES / "perrequest" / "ngram-k3-copy.requests.json"
CONFIG = {"base_url": "http://127.0.0.1:8000", "role": "speculative", "workloads": ["copy", "explain"],
          "concurrencies": [1, 4], "num_batches": 2, "warmup_batches": 1}


def _spec_requests(batch_index: int, take: slice, success: bool = True) -> list:
    reqs = json.loads(PERREQUEST.read_text(encoding="utf-8"))[take]
    return [((r["final_chunk"].get("metrics") or {}).get("speculative_decoding"),
             {"index": r["index"], "batch_index": batch_index, "success": success, "n": 1,
              "output_tokens": (r["final_chunk"].get("usage") or {}).get("completion_tokens", 0),
              "prompt_excerpt": r["prompt_excerpt"]}) for r in reqs]


def build_batches() -> list[BatchResult]:
    """Batches that reach every branch of the writer: a baseline without spec-decode counters, a
    warm-up, speculative batches with step counters and per-request payloads, a ragged curve, a
    failed request with its error, a batch of zero duration and one whose /metrics failed."""
    steps = StepCounters(itl_sum=3.25, itl_count=410.0, iteration_count=130.0, ttft_count=4.0, generation_tokens=512.0)
    full = SpecDecodeCounters("m", "0", drafts=100.0, draft_tokens=300.0, accepted_tokens=187.0,
                              accepted_per_position=(81.0, 60.0, 46.0), generation_tokens=512.0)
    ragged = SpecDecodeCounters("m", "0", drafts=90.0, draft_tokens=200.0, accepted_tokens=121.0,
                                accepted_per_position=(70.0, 40.0, 11.0), generation_tokens=300.0)
    lat = {"ttfts": [0.11, 0.13, 0.095, 0.2], "tpots": [0.021, 0.019, 0.0233, 0.02],
           "itls": [0.02, 0.019, 0.05, 0.021, 0.018, 0.03], "e2els": [1.3, 1.41, 1.25, 1.6]}
    out = [
        BatchResult("baseline", "copy", 1, 0, True, "2026-12-02T10:00:00+00:00", 1.5, 1, 1, 0, 135, 64, True, None,
                    SpecDecodeStats("none", None), ttfts=[0.09], tpots=[0.022], itls=[0.022] * 3, e2els=[1.5]),
        BatchResult("baseline", "copy", 1, 1, False, "2026-12-02T10:00:02+00:00", 1.45, 1, 1, 0, 135, 64, True, None,
                    SpecDecodeStats("none", None, steps=steps), ttfts=[0.1], tpots=[0.021], itls=[0.021] * 3,
                    e2els=[1.45]),
        BatchResult("baseline", "copy", 1, 2, False, "2026-12-02T10:00:04+00:00", 1.52, 1, 1, 0, 135, 64, False, 2.5,
                    SpecDecodeStats("none", None, metrics_error="cannot read http://127.0.0.1:8001/metrics: timed out"),
                    ttfts=[0.12], tpots=[0.023], itls=[0.023] * 3, e2els=[1.52]),
        BatchResult("speculative", "copy", 4, 1, False, "2026-12-02T10:01:00+00:00", 2.0, 4, 4, 0, 540, 512, True, None,
                    SpecDecodeStats("v1", full, steps=steps), spec_requests=_spec_requests(1, slice(0, 4)), **lat),
        BatchResult("speculative", "copy", 4, 2, False, "2026-12-02T10:01:03+00:00", 2.2, 4, 3, 1, 405, 384, True, None,
                    SpecDecodeStats("v1", ragged, steps=steps),
                    errors=[{"index": 3, "error": "HTTP 500: Internal Server Error"}],
                    spec_requests=_spec_requests(2, slice(4, 7)) + [(None, {"index": 3, "batch_index": 2,
                                                                          "success": False})], **lat),
        BatchResult("speculative", "explain", 4, 1, False, "2026-12-02T10:02:00+00:00", 0.0, 4, 0, 4, 0, 0, False, None,
                    SpecDecodeStats("v1", None), errors=[{"index": i, "error": "connection refused"} for i in range(4)]),
    ]
    return out


#: :mod:`specwatch.bench.equivalence`'s document (the writer keeps it verbatim).
EQUIVALENCE = {"matched": 1, "total": 2, "output_len": 16, "prompts": [
    {"name": "copy-0", "identical": True, "first_difference": None, "baseline_chars": 21, "speculative_chars": 21,
     "error": None},
    {"name": "copy-1", "identical": False, "first_difference": 2, "baseline_chars": 3, "speculative_chars": 3,
     "error": None, "first_differing_token": {"index": 1, "baseline": "c", "speculative": "d"}}]}


def write_run(out_dir: Path, status: str = "complete") -> tuple[Path, Path]:
    """Write the bench files of :func:`build_batches` into ``out_dir`` (the writer's JSON and CSV)."""
    js, cs = out_dir / "bench-run.json", out_dir / "bench-run.csv"
    ResultWriter(js, cs, CONFIG).write(build_batches(), status, equivalence=Equivalence.from_json(EQUIVALENCE),
                                       started_at="2026-12-02T10:00:00+00:00")
    return js, cs


def test_the_writer_writes_the_same_bytes_as_the_dict_building_writer(tmp_path):
    js, cs = write_run(tmp_path)
    assert js.read_bytes() == (EXPECTED / "bench-run.json").read_bytes()
    assert cs.read_bytes() == (EXPECTED / "bench-run.csv").read_bytes()


def test_a_failed_run_writes_the_same_bytes_too(tmp_path):
    js = tmp_path / "b.json"
    ResultWriter(js, None, CONFIG).write(build_batches()[:2], "failed", started_at="t", error="the server died")
    assert js.read_bytes() == (EXPECTED / "bench-failed.json").read_bytes()


def test_the_written_file_reads_back_into_the_records_that_wrote_it(tmp_path):
    js, _ = write_run(tmp_path)
    rec = BenchResult.load(js)
    assert json.dumps(rec.to_json(), indent=1) + "\n" == js.read_text(encoding="utf-8")
    batches = build_batches()
    assert [b.to_record() for b in batches] == list(rec.batches)
    cell = rec.cells[1]
    assert isinstance(cell, BenchCell) and cell.acceptance_rate is not None and 0 < cell.acceptance_rate < 1
    assert rec.batches[0].acceptance_rate is None and isinstance(rec.batches[3], BenchBatch)


def test_the_acceptance_rate_is_a_fraction_inside_and_percent_in_the_file(tmp_path):
    js, _ = write_run(tmp_path)
    doc = json.loads(js.read_text(encoding="utf-8"))
    cell = CellSummary("speculative", "copy", 4, build_batches()[3:5]).to_record()
    assert 0 < cell.acceptance_rate < 1
    assert doc["summary"][1]["spec_decode_acceptance_rate"] == cell.acceptance_rate * 100


if __name__ == "__main__":  # regenerate the expected files (only from the dict-building writer's code)
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    write_run(target)
    ResultWriter(target / "bench-failed.json", None, CONFIG).write(build_batches()[:2], "failed", started_at="t",
                                                                   error="the server died")

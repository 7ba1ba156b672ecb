"""Load-generator records built with the load generator's own result classes (the real code path
that writes them), for the tests of the readers."""

from __future__ import annotations

from specwatch.bench.results import BatchResult, CellSummary, SpecDecodeStats
from specwatch.specdecode.metrics import SpecDecodeCounters


def one_batch_cell_record() -> dict:
    """The cell record (``CellSummary.to_record().to_json()``, as a result file holds it) of one measured batch: role speculative, workload
    copy, concurrency 4, 4 requests in 2.0 s, 100 input and 512 output tokens, TPOT 10 ms and TTFT
    100 ms each; its V1 spec-decode delta (model m, engine 0): 100 drafts, 400 draft tokens, 250
    accepted (per position 90, 70, 50, 40), 512 generated."""
    delta = SpecDecodeCounters("m", "0", drafts=100.0, draft_tokens=400.0, accepted_tokens=250.0,
                               accepted_per_position=(90.0, 70.0, 50.0, 40.0), generation_tokens=512.0)
    b = BatchResult("speculative", "copy", 4, 1, False, "t", 2.0, 4, 4, 0, 100, 512, True, None,
                    SpecDecodeStats("v1", delta), tpots=[0.01] * 4, ttfts=[0.1] * 4)
    return CellSummary("speculative", "copy", 4, [b]).to_record().to_json()

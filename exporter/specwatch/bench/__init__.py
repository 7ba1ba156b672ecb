"""``specwatch bench``: the load generator reproducing the published speculative-decoding workloads (docs/load-generator.md).

Parts (swappable, as in ``vllm/benchmarks``): :mod:`.workloads` (frozen requests, seeded
sampling, our own texts), :mod:`.backend` (async aiohttp streaming client), :mod:`.runner`
(scheduling and the Python API :func:`run_bench`), :mod:`.results` (metrics, console tables; the
JSON/CSV writer), :mod:`.records` (the result file's typed records: the only module that knows its
fields), :mod:`.perrequest` (exact curves from vLLM's per-request metrics), :mod:`.equivalence`
(greedy-output check), :mod:`.metrics` (``specwatch_bench_*`` metrics), :mod:`.cli` (the click
command). The local streaming stubs for tests and the client benchmark are
:mod:`specwatch.testing.stubserver` and :mod:`specwatch.testing.faststub`.
"""

from specwatch.bench.runner import BenchConfig, BenchConfigError, BenchInterrupted, RunResult, run_bench, run_bench_async
from specwatch.bench.workloads import WORKLOADS, WorkloadOptions

__all__ = [
    "BenchConfig", "BenchConfigError", "BenchInterrupted", "RunResult", "run_bench", "run_bench_async",
    "WORKLOADS", "WorkloadOptions",
]

"""``specwatch bench``: the load generator reproducing the published speculative-decoding workloads (docs/load-generator.md).

Parts (swappable, as in ``vllm/benchmarks``): :mod:`.workloads` (frozen requests, seeded
sampling, our own texts), :mod:`.backend` (async aiohttp streaming client), :mod:`.runner`
(scheduling and the Python API :func:`run_bench`), :mod:`.results` (metrics, JSON/CSV, tables),
:mod:`.equivalence` (greedy-output check), :mod:`.promexport` (``specwatch_bench_*`` metrics),
:mod:`.cli` (the click command). :mod:`.stubserver` is a local streaming stub for tests and the
client benchmark.
"""

from specwatch.bench.runner import BenchConfig, BenchConfigError, BenchInterrupted, RunResult, run_bench, run_bench_async
from specwatch.bench.workloads import WORKLOADS, WorkloadOptions

__all__ = [
    "BenchConfig", "BenchConfigError", "BenchInterrupted", "RunResult", "run_bench", "run_bench_async",
    "WORKLOADS", "WorkloadOptions",
]

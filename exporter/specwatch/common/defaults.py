"""Default ports and size limits, in one place for every command, the mixin's scrape configs and
the compose file's documentation.

Ports: vLLM's own default (8000) for the speculative server, 8001 for the baseline beside it,
Prometheus' 9090, and 19337/19338 for the exporter and the load generator's metrics (outside
9100-9999, which Prometheus' default port allocations page has fully allocated).
"""

from __future__ import annotations

#: The speculative vLLM server (vLLM's own default port).
VLLM_PORT = 8000
#: The baseline vLLM server (no speculation) run beside or after it.
BASELINE_VLLM_PORT = 8001
#: Prometheus' default port.
PROMETHEUS_PORT = 9090
#: The specwatch exporter (`specwatch serve`). Prometheus' default-port allocation list has no free
#: port left in the exporter range 9100–9999, so specwatch uses one outside it that no well-known
#: exporter claims.
EXPORTER_PORT = 19337
#: The load generator's own metrics (`specwatch bench --metrics-port`).
BENCH_METRICS_PORT = 19338

#: Largest /metrics body the exporter and the load generator read from an upstream (bytes).
MAX_METRICS_BODY_BYTES = 16 * 1024 * 1024
#: Largest HTTP response body the load generator reads from vLLM (bytes).
MAX_RESPONSE_BYTES = 16 * 1024 * 1024

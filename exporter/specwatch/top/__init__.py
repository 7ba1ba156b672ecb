"""``specwatch top``: a live terminal view of speculative decoding (in the manner of htop/nvtop).

Layers, bottom up (none imports upward):

- :mod:`specwatch.top.model`: pure code. Parses an exporter's exposition text (with
  ``prometheus_client.parser``) into one :class:`~specwatch.top.model.EngineView` per upstream,
  model and engine for a chosen window. Nothing is derived here: every number is a series the
  exporter serves (which one is named in the field docstrings).
- :mod:`specwatch.top.sources`: where the exposition comes from: a running exporter over HTTP, or
  vLLM upstreams scraped by the exporter's own collector in this process.
- :mod:`specwatch.top.render`: rich renderables for the live view and plain text for ``--once``.
- :mod:`specwatch.top.cli`: the click command, the refresh loop and the keys.
"""

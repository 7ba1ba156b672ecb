"""specwatch's monitoring mixin: Prometheus recording rules, alerts and configuration, Kubernetes
objects and Grafana dashboards generated from one MixinConfig (config.py).
``python -m specwatch.mixin.generate`` writes prometheus/ and dashboards/generated/."""

from specwatch.mixin.config import DEFAULT_CONFIG, MixinConfig

__all__ = ["DEFAULT_CONFIG", "MixinConfig"]

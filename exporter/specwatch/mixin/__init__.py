"""specwatch's monitoring mixin: Prometheus recording rules, alerts and configuration generated
from one MixinConfig (config.py). ``python -m specwatch.mixin.generate`` writes prometheus/."""

from specwatch.mixin.config import DEFAULT_CONFIG, MixinConfig

__all__ = ["DEFAULT_CONFIG", "MixinConfig"]

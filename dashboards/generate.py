#!/usr/bin/env python3
"""Shim: ``python dashboards/generate.py [--config F] [--check] [--out DIR]`` runs the mixin's one
generator, ``python -m specwatch.mixin.generate --root <this repository>`` (see docs/mixin.md);
``--out DIR`` renders only the dashboards, into DIR. Needs specwatch with the mixin extra."""

import sys
from pathlib import Path

from specwatch.mixin.generate import dashboards_script_main

if __name__ == "__main__":
    sys.exit(dashboards_script_main(sys.argv[1:], root=Path(__file__).resolve().parents[1]))

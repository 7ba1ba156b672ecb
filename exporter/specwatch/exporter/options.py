"""Click option definitions shared by ``specwatch serve`` and ``specwatch top --upstream``.

The four options that change what the exporter derives from an upstream (which cost profile gives
the step times, which upstream is the baseline, which method and drafter pick the profile's
curve) are defined once here, so the two commands cannot drift. ``top`` adds them without their
environment variables: inside the exporter's container ``SPECWATCH_COST_PROFILE`` etc. are set for
``serve``, and ``top`` there reads the exporter, which applies them itself.
"""

from __future__ import annotations

from collections.abc import Callable

import click

#: (flag, parameter name, environment variable or None, help)
COST_OPTIONS: tuple[tuple[str, str, str | None, str], ...] = (
    ("--cost-profile", "cost_profile", "SPECWATCH_COST_PROFILE",
     "Measured step times (specwatch calibrate): speedups with basis calibrated (the server's k) and profile (what-if k). "
     "Without it they are a built-in guess, labelled basis=default."),
    ("--baseline-upstream", "baseline_upstream", "SPECWATCH_BASELINE_UPSTREAM",
     "NAME of an --upstream that runs without speculation: its live decode speed is the "
     "measured speedup's denominator (the compose `baseline` profile)."),
    ("--speculative-method", "speculative_method", None,
     "The method every upstream runs unless its --upstream options say otherwise: picks the cost-profile "
     "curve (default: the profile's first) and labels specwatch_speculative_method_info."),
    ("--drafter", "drafter", None,
     "The drafter (draft_model, eagle) every upstream runs unless its --upstream options say otherwise, "
     "spelled as in the cost profile; a profile without a curve for it gives no what-if speedups and "
     "no recommended k (specwatch_recommendation_withheld{reason=\"no_cost_curve\"})."),
)

#: The parameter names :func:`cost_options` adds, in order.
COST_OPTION_NAMES: tuple[str, ...] = tuple(name for _, name, _, _ in COST_OPTIONS)


def cost_options(*, envvars: bool = True, help_prefix: str = "") -> Callable:
    """A decorator adding the :data:`COST_OPTIONS` to a click command (each a string option,
    default None), with their environment variables when ``envvars`` and ``help_prefix`` before
    each help text."""
    def decorate(f: Callable) -> Callable:
        for flag, name, env, text in reversed(COST_OPTIONS):
            f = click.option(flag, name, default=None, envvar=env if envvars else None,
                             help=help_prefix + text)(f)
        return f
    return decorate

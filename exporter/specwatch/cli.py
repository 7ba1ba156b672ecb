"""The ``specwatch`` console script: one click group whose subcommands are the user's verbs.

Subcommands are imported lazily, so ``specwatch --help`` stays fast and a command that needs
vLLM (``prepare-model``, ``vllm``) does not slow down one that does not (``serve``).
"""

from __future__ import annotations

import importlib

import click

from specwatch import __version__

# command name -> "module:attribute" of a click.Command
COMMANDS: dict[str, str] = {
    "serve": "specwatch.exporter.server:serve",
    "bench": "specwatch.bench.cli:bench",
    "sweep": "specwatch.choosek.cli:sweep",
    "advise": "specwatch.choosek.cli:advise",
    "report": "specwatch.choosek.cli:report",
    "calibrate": "specwatch.choosek.cli:calibrate",
    "prepare-model": "specwatch.localvllm.cli:prepare_model_cmd",
    "vllm": "specwatch.localvllm.cli:vllm_cmd",
    "demo": "specwatch.demo:demo",
    "top": "specwatch.top.cli:top",
}


class LazyGroup(click.Group):
    """A click group that imports each subcommand's module only when it is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and not exc.name.startswith("specwatch"):
                # a third-party dependency of this command is not installed (an extra left out)
                raise click.ClickException(
                    f"'specwatch {cmd_name}' needs the Python package {exc.name!r}, which is not installed; "
                    "install specwatch with the extra for it (pip install 'specwatch[all]')") from None
            raise  # a broken checkout: show the real error, not "No such command"
        return getattr(module, attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specwatch")
def main() -> None:
    """Monitor speculative decoding on vLLM and pick num_speculative_tokens (k)."""

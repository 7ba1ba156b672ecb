"""The package's layering (docs/architecture.md): pure speculative-decoding maths and shared helpers
at the bottom, the exporter / mixin / load generator / local vLLM launcher above them, the k-choice
pipeline and `specwatch top` above those, the demo on top. No module imports a higher layer or
another part of its own layer, and no part imports another part's command module (cli.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "exporter" / "specwatch"
LAYER = {"common": 0, "specdecode": 1, "exporter": 2, "mixin": 2, "bench": 2, "localvllm": 2, "testing": 2,
         "choosek": 3, "top": 3, "demo": 4, "cli": 5, "__main__": 5}


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specwatch."):
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("specwatch.")]
    return out


def test_every_part_is_placed_in_a_layer():
    parts = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    parts |= {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert parts == set(LAYER), "a new part of the package: give it a layer here and in docs/architecture.md"


#: Command modules besides the */cli.py ones (docs/architecture.md): only __main__ may import them.
COMMAND_MODULES = {"specwatch.exporter.server", "specwatch.demo"}

#: The one upward edge (docs/architecture.md): the k-choice commands `advise` and `report` also take
#: a `specwatch demo` result folder, and read it through the demo's report module (issue #39 stage 2).
COMMANDS_READING_THE_DEMO = {("choosek/cli.py", "specwatch.demo.report")}


def test_no_upward_or_sideways_imports_and_no_foreign_command_modules():
    bad = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).with_suffix("").parts
        src = rel[0]
        if src == "__init__":
            continue
        for mod in _imports(path):
            dst = mod.split(".")[1]
            if dst == src:
                continue
            if LAYER[dst] >= LAYER[src] and not (src == "__main__" and dst == "cli") \
                    and ("/".join(rel) + ".py", mod) not in COMMANDS_READING_THE_DEMO:
                bad.append(f"{'/'.join(rel)}.py imports {mod} (layer {LAYER[dst]} from layer {LAYER[src]})")
            if (mod.split(".")[-1] == "cli" or mod in COMMAND_MODULES) and src != "__main__":
                bad.append(f"{'/'.join(rel)}.py imports the command module {mod}")
    assert not bad, "\n".join(bad)


def test_no_specwatch_import_hides_inside_a_function():
    """Edges between parts are read from module headers: a function-level import of a specwatch
    module would hide one (third-party imports inside functions carry their measured reason)."""
    hidden = []
    for path in PACKAGE.rglob("*.py"):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                mods = ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                        else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                hidden += [f"{path.relative_to(PACKAGE)}:{node.lineno} {fn.name}() imports {m}"
                           for m in mods if m.startswith("specwatch")]
    assert not hidden, "\n".join(hidden)


# Third-party packages that only extras bring (pyproject.toml); the exporter must not need them.
NOT_CORE = ("rich", "psutil", "matplotlib", "jinja2", "markupsafe", "grafanalib", "promql_parser", "vllm", "torch",
            "transformers", "gguf", "safetensors")


def test_the_core_dependencies_are_all_that_serve_needs():
    """docs/development.md and pyproject.toml: the core (no extra) runs `specwatch serve` and imports
    the mixin's generator (running it renders the dashboards: the mixin extra, see
    tests/unit/test_mixin_generate.py). Check both with every extra-only package made unimportable."""
    block = ("import sys\n"
             "class _Block:\n"
             f"    names = {NOT_CORE!r}\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name.split('.')[0] in self.names:\n"
             "            raise ModuleNotFoundError(f'blocked: {name}', name=name)\n"
             "sys.meta_path.insert(0, _Block())\n")
    code = block + ("import specwatch.exporter.server, specwatch.mixin.generate\n"
                    "from specwatch.cli import main\n"
                    "sys.argv = ['specwatch', 'serve', '--help']\n"
                    "main()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--upstream" in r.stdout, r.stderr[-2000:]
    # and the block works: a command of an extra reports the missing package by name
    r = subprocess.run([sys.executable, "-c", block + "from specwatch.cli import main\n"
                        "sys.argv = ['specwatch', 'report', '--help']\nmain()\n"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "needs the Python package" in r.stderr, (r.stdout[-500:], r.stderr[-1000:])


def test_one_tie_tolerance():
    """Issue #24: "one tolerance constant". The tie rule's relative tolerance (a smaller k within
    it of the best wins) is written as a number once, in specdecode/decision.py; every other
    module-level *TOLERANCE constant that holds a number literal is a different quantity, named here."""
    literal = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, (int, float))):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id.endswith("TOLERANCE"):
                        literal[f"{path.relative_to(PACKAGE).as_posix()}:{t.id}"] = node.value.value
    assert literal == {
        "specdecode/decision.py:TOLERANCE": 0.02,  # the tie rule
        "specdecode/ragged.py:RAGGED_RELATIVE_TOLERANCE": 0.005,  # missing draft tokens, relative
        "specdecode/ragged.py:RAGGED_ABSOLUTE_TOLERANCE": 1.0,  # missing draft tokens, absolute
        "specdecode/speedup.py:DEFAULT_CONTRADICTION_TOLERANCE": 0.25,  # measured vs calibrated
    }
    from specwatch.choosek.model import DEFAULT_TOLERANCE
    from specwatch.specdecode.decision import TOLERANCE
    assert DEFAULT_TOLERANCE is TOLERANCE


#: The modules that may import click (issue #39): the commands and the command layer's own helpers.
#: Every other module raises plain exceptions (one line each), which a command maps to click's
#: "Error: …" line and exit status (e.g. choosek/cli.py ``OneLineErrors`` for SweepError,
#: WriteCheckError and PrometheusError).
CLICK_MODULES = {
    "cli.py": "the specwatch click group",
    "bench/cli.py": "the bench command",
    "choosek/cli.py": "the sweep, advise, report and calibrate commands",
    "localvllm/cli.py": "the prepare-model and vllm commands",
    "top/cli.py": "the top command",
    "exporter/server.py": "the serve command",
    "exporter/options.py": "the click options serve and top --upstream share",
    "mixin/generate.py": "the generator's command (python -m specwatch.mixin.generate)",
    "common/params.py": "the click parameter types of the commands' flags (--k 1,2,4, a NaN-free float range)",
    "demo/__init__.py": "the demo command",
    "demo/flags.py": "the demo command's flags and their checks (DemoFlagError: a usage error)",
}


def _imports_click(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "click" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "click" and not node.level:
            return True
    return False


def test_only_command_modules_import_click():
    """Issue #39: records, result files and advice are libraries: only the command modules (and
    the command layer's helpers) named in CLICK_MODULES import click."""
    users = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py") if _imports_click(path)}
    assert users - set(CLICK_MODULES) == set(), "a non-command module imports click"
    for rel in ("choosek/records.py", "choosek/resultfile.py", "choosek/advise.py"):
        assert rel not in users, rel

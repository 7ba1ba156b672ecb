"""The test tiers (markers in pyproject.toml, stages in scripts/test.sh), read from the test
sources: a test that imports vLLM's packages (vllm, torch, transformers, ...) carries ``vllmpkg``
or ``realvllm``, so the fast stage leaves it out, and no test module imports them at its top,
where collecting it (every stage, every pytest-xdist worker) would pay for them even when ``-m``
leaves all its tests out. A process a test starts (scripts/bench_client.py) is not seen here: such
a test is marked by hand."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
PACKAGES = {"vllm", "torch", "transformers", "gguf", "safetensors", "tokenizers", "accelerate"}
TIERS = ("vllmpkg", "realvllm")
# the calls that import a module named by their first argument
IMPORTING_CALLS = {"importorskip", "import_module", "needs_cpu_extra"}


def _package_imports(tree: ast.AST, skip_functions: bool = False) -> list[str]:
    """``line: module`` for each import of one of PACKAGES under ``tree`` (statements and calls
    such as ``pytest.importorskip("torch")``), leaving out function bodies with ``skip_functions``."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        if skip_functions and node is not tree and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        todo.extend(ast.iter_child_nodes(node))
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            names = [node.args[0].value] if func in IMPORTING_CALLS else []
        found += [f"{node.lineno}: {n}" for n in names if n.split(".")[0] in PACKAGES]
    return found


def _marked(nodes) -> bool:
    return any(f"mark.{tier}" in ast.unparse(n) for n in nodes for tier in TIERS)


def _fixture_tiers() -> dict[str, str]:
    tree = ast.parse((TESTS / "conftest.py").read_text())
    (value,) = [n.value for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_FIXTURE_TIERS"]
    return ast.literal_eval(value)


def _modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "fixtures" not in p.relative_to(TESTS).parts)


def test_no_test_module_imports_vllms_packages_at_its_top():
    top = [f"{p.relative_to(TESTS)}:{hit}" for p in _modules() for hit in _package_imports(ast.parse(p.read_text()), True)]
    assert not top, "import these inside the test or fixture that needs them (and mark it vllmpkg):\n" + "\n".join(top)


def test_every_test_that_imports_vllms_packages_is_marked():
    """A function that imports them is a test or fixture marked vllmpkg or realvllm (itself, by its
    module's ``pytestmark`` or, for a fixture, by tests/conftest.py's _FIXTURE_TIERS), or a helper
    in a module marked so."""
    fixture_ok = {f for f, tier in _fixture_tiers().items() if tier in TIERS}
    unmarked, seen = [], []
    for path in _modules():
        tree = ast.parse(path.read_text())
        module_marked = _marked(n.value for n in tree.body if isinstance(n, ast.Assign)
                                and any(ast.unparse(t) == "pytestmark" for t in n.targets))
        for fn in tree.body:
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not _package_imports(fn):
                continue
            seen.append(fn.name)
            if not (module_marked or _marked(fn.decorator_list) or fn.name in fixture_ok):
                unmarked.append(f"{path.relative_to(TESTS)}: {fn.name}() imports {', '.join(_package_imports(fn))}")
    assert {"test_dynamic_schedule_is_accepted_by_vllm", "prepared_model_dir", "make_target"} <= set(seen), seen  # not vacuous
    assert not unmarked, "mark these @pytest.mark.vllmpkg (or realvllm):\n" + "\n".join(unmarked)

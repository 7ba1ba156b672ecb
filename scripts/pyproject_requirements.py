"""Print the requirements of this project as ``pip install .[EXTRA,...]`` would install them, one
per line, read from pyproject.toml alone (the Dockerfiles install them in a layer of their own,
which Docker's cache keeps until this list changes).

    python scripts/pyproject_requirements.py [PYPROJECT] [EXTRA ...]

Self-references such as ``specwatch[localvllm]`` inside an extra are expanded into that extra's
requirements (each extra once). An extra the project does not define is skipped with a note on
stderr, as pip does. Needs Python 3.11+ (tomllib). Exit status 2 for a missing or unreadable file.
"""

from __future__ import annotations

import re
import sys
import tomllib


def requirements(project: dict, extras: list[str]) -> list[str]:
    """``project``'s dependencies plus those of ``extras``, self-references expanded, in order,
    without duplicates."""
    name = re.sub(r"[-_.]+", "-", project["name"]).lower()
    optional = project.get("optional-dependencies", {})
    out: list[str] = []
    seen: set[str] = set()

    def add(reqs: list[str]) -> None:
        for req in reqs:
            m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*\[([^\]]*)\]\s*$", req)
            if m and re.sub(r"[-_.]+", "-", m.group(1)).lower() == name:
                add_extras([e.strip() for e in m.group(2).split(",") if e.strip()])
            elif req not in out:
                out.append(req)

    def add_extras(names: list[str]) -> None:
        for extra in names:
            if extra in seen:
                continue
            seen.add(extra)
            if extra not in optional:
                print(f"note: {project['name']} has no extra {extra!r}; skipped", file=sys.stderr)
                continue
            add(optional[extra])

    add(project.get("dependencies", []))
    add_extras(extras)
    return out


def main(argv: list[str]) -> int:
    path = argv[0] if argv else "pyproject.toml"
    try:
        with open(path, "rb") as f:
            project = tomllib.load(f)["project"]
    except (OSError, tomllib.TOMLDecodeError, KeyError) as exc:
        print(f"pyproject_requirements: cannot read [project] from {path}: {exc}", file=sys.stderr)
        return 2
    print("\n".join(requirements(project, argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

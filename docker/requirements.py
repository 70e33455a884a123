"""Print requirement lines from pyproject.toml, for an image's dependency layer.

    python3 requirements.py pyproject.toml [--extras docker,plots] [--only fastapi,uvicorn]

The base dependencies (all, or only the named distributions) and the named extras' (an extra
that names ``agentrl[...]`` is followed). Installing these before the project's source keeps
the dependency layer cached while the code changes. Standard library only (tomllib).
"""

from __future__ import annotations

import argparse
import re
import tomllib


def name_of(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("pyproject")
    ap.add_argument("--extras", default="")
    ap.add_argument("--only", default="", help="keep only these base distributions (comma-separated)")
    args = ap.parse_args()
    with open(args.pyproject, "rb") as f:
        project = tomllib.load(f)["project"]
    base = project["dependencies"]
    if args.only:
        keep = {n.strip().lower() for n in args.only.split(",")}
        missing = keep - {name_of(r) for r in base}
        if missing:
            raise SystemExit(f"--only names {sorted(missing)}, which are not base dependencies of {project['name']}")
        base = [r for r in base if name_of(r) in keep]
    lines, todo, seen = list(base), [e for e in args.extras.split(",") if e], set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        if extra not in project.get("optional-dependencies", {}):
            raise SystemExit(f"no extra {extra!r} in {args.pyproject}")
        for r in project["optional-dependencies"][extra]:
            m = re.fullmatch(rf"{re.escape(project['name'])}\[([^\]]+)\]", r.strip())
            if m:
                todo.extend(x.strip() for x in m.group(1).split(","))
            else:
                lines.append(r)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

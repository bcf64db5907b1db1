#!/usr/bin/env python3
"""Checks that the server's modules depend on each other in one direction only.

    workflow (pure) <- config <- store <- engine <- state <- {http, broker} <- runtime <- main/lib

A module may use the layers to its left. `config` uses only `workflow` (the server's
default step retry policy is a workflow type, checked by the workflow's own rules);
`state` is one runtime's `Core` (its pool, buffer and executor), which the adapters
(http, broker) are handed. The leaf modules (metrics, ids, backoff) may be used by any
layer and use no project module themselves.
Every `crate::<module>` path in a file under src/<module>/ (or src/<module>.rs), outside
its tests, is an arrow; the check fails on any arrow against the direction.

    scripts/check-deps.py            # exit 1 and the offending files on a violation
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LAYER = {
    "workflow": 1,
    "config": 2,
    "store": 3,
    "engine": 4,
    "state": 5,
    "http": 6,
    "broker": 6,
    "runtime": 7,
    "lib": 8,
    "main": 8,
}
LEAVES = {"metrics", "ids", "backoff", "error_chain", "batches"}
USE = re.compile(r"\bcrate::([a-z_]+)")
GROUP = re.compile(r"\buse crate::\{([^}]*)\}", re.S)


def module_of(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT / "src")
    return rel.parts[0].removesuffix(".rs")


def arrows():
    found = {}
    for f in sorted((ROOT / "src").rglob("*.rs")):
        src = f.read_text()
        # Tests beside the code may use anything.
        src = src.split("#[cfg(test)]")[0]
        names = set(USE.findall(src))
        for group in GROUP.findall(src):
            names |= {m.group(1) for m in re.finditer(r"(?:^|,)\s*([a-z_]+)", group)}
        me = module_of(f)
        for target in names:
            if target != me and (target in LAYER or target in LEAVES):
                found.setdefault((me, target), []).append(str(f.relative_to(ROOT)))
    return found


def allowed(src: str, dst: str) -> bool:
    if src in LEAVES:
        return False  # leaves use no project module
    if dst in LEAVES:
        return True
    return LAYER[dst] < LAYER[src]


def main() -> int:
    bad = 0
    all_arrows = arrows()
    for (a, b), files in sorted(all_arrows.items()):
        if a not in LAYER and a not in LEAVES:
            continue
        if not allowed(a, b):
            print(f"check-deps: {a} -> {b} points against the direction: {', '.join(sorted(set(files)))}")
            bad += 1
    if bad == 0:
        print(f"check-deps: {len(all_arrows)} arrows between modules, all in the direction")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

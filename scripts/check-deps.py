#!/usr/bin/env python3
"""Checks that the server's modules depend on each other in one direction only.

    workflow (pure) <- config <- outbound <- store <- reads <- engine <- state <- ops <- {http, broker} <- runtime <- main/lib

`workflow_files` (the `clamp workflows` subcommand) stands beside `runtime`.

A module may use the layers to its left. `config` uses only `workflow` (the server's
default step retry policy is a workflow type, checked by the workflow's own rules);
`outbound` calls the outside world (a step's HTTP call, its publish, their TLS and
per-host limits) and knows nothing of requests or Postgres. `reads` holds what status
reads are answered from besides Postgres (final answers, long polls, the paused hint),
which the engine fills and ops reads. `state` is one runtime's
`Core` (its pool, buffer and executor), which the carriers (http, broker) are handed.
The carriers reach the store and the engine only through `ops` (the only door: their
types too, as ops re-exports them), never by name. The leaf modules (metrics, ids, backoff, tokens, destinations,
secrets, …) may be used by any
layer and use no project module themselves, but for the route table (`routes`: every
route's method, path, operation and metric name), which metrics reads.
Every `crate::<module>` path in a file under src/<module>/ (or src/<module>.rs), outside
its tests, is an arrow; the check fails on any arrow against the direction.

Inside one module, files may use each other but never in a circle: a file that uses a
sibling (`super::x`, `crate::<module>::x`, or `x` named in `use super::{…}`) is an
arrow between files, `mod.rs` (which declares and re-exports its children) aside, and
the check fails on any cycle of such arrows.

Answers are built in one layer: `http/` renders every answer's JSON and every page's
markup from the typed results of `ops/`. Below it, `maud` is used nowhere, and the layers
an answer's data passes through on its way up (store, state, ops, config, telemetry and
the leaves) build no JSON (`json!`, `serde_json::Map::new`): they return rows and typed
structs. The engine and the workflow language build JSON of their own (a step's request,
its context, its record), which is workflow data, not an answer.

No status is spelled outside src/status.rs: as SQL (`'NEW'`) or a Rust string (`"NEW"`),
statements and code use `RequestStatus`, `StepStatus` and `status_sql!`.

    scripts/check-deps.py            # exit 1 and the offending files on a violation
"""
import os
import pathlib
import re
import sys

# CHECK_DEPS_ROOT: another checkout to check (scripts/test_check_deps.py checks copies
# with a violation put in on purpose).
ROOT = pathlib.Path(os.environ.get("CHECK_DEPS_ROOT") or pathlib.Path(__file__).resolve().parent.parent)
LAYER = {
    "workflow": 1,
    "telemetry": 1,
    "config": 2,
    "outbound": 2.5,
    "store": 3,
    "reads": 3.5,
    "engine": 4,
    "state": 5,
    "ops": 6,
    "http": 7,
    "broker": 7,
    "runtime": 8,
    "workflow_files": 8,
    "lib": 9,
    "main": 9,
}
LEAVES = {"metrics", "ids", "backoff", "error_chain", "batches", "tls", "status", "tokens", "destinations", "secrets",
          "routes"}
# The route table and the statuses are data beneath every layer: the leaves another leaf
# may read (metrics names each route's metrics, and counts requests by final status).
# They use nothing themselves.
TABLES = {"routes", "status"}
# ops is the only door: the carriers (the API and console, the broker consumers) reach the
# store and the engine through it, never by name.
BEHIND_OPS = {"store", "engine"}
CARRIERS = {"http", "broker"}
USE = re.compile(r"\bcrate::([a-z_]+)")
GROUP = re.compile(r"\buse crate::\{([^}]*)\}", re.S)


# Where answers may be built, and what building one looks like.
MARKUP_OK = {"http"}
JSON_OK = {"http", "broker", "runtime", "workflow_files", "lib", "main", "engine", "outbound", "workflow"}
MARKUP = re.compile(r"\bmaud\b|\bhtml!\s*\{")
JSON_BUILT = re.compile(r"\bjson!\s*[({\[]|\bserde_json::Map::(?:new|with_capacity)\b|\bMap::(?:new|with_capacity)\(")


def answers_below_http():
    """(file, what) for each answer built below `http/`, tests aside."""
    out = []
    for f in sorted((ROOT / "src").rglob("*.rs")):
        me = module_of(f)
        src = f.read_text().split("#[cfg(test)]")[0]
        rel = str(f.relative_to(ROOT))
        if me not in MARKUP_OK and MARKUP.search(src):
            out.append((rel, "markup (maud)"))
        if me not in JSON_OK and JSON_BUILT.search(src):
            out.append((rel, "JSON (json!, serde_json::Map)"))
    return out


# A status spelled as SQL or as a Rust string: only src/status.rs may (comments, tests and
# migrations aside).
STATUS_SPELLED = re.compile(r"['\"](NEW|IN_PROGRESS|PAUSED|RESUMED|COMPLETED|FAILED|CANCELLED|STARTED|SKIPPED)['\"]")


def statuses_spelled():
    """(file, line, spelling) for each status spelled outside src/status.rs."""
    out = []
    for f in sorted((ROOT / "src").rglob("*.rs")):
        if f == ROOT / "src" / "status.rs":
            continue
        src = f.read_text().split("#[cfg(test)]")[0]
        for n, line in enumerate(src.splitlines(), 1):
            if line.lstrip().startswith("//"):
                continue
            for m in STATUS_SPELLED.finditer(line):
                out.append((str(f.relative_to(ROOT)), n, m.group(0)))
    return out


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
    if src in CARRIERS and dst in BEHIND_OPS:
        return False
    if src in LEAVES:
        return dst in TABLES and src not in TABLES  # leaves use no project module but the table
    if dst in LEAVES:
        return True
    return LAYER[dst] < LAYER[src]


def file_arrows(folder: pathlib.Path):
    """Arrows between the files (and sub-folders) of one folder, from `super::x` and
    `crate::<folder path>::x` paths; `mod.rs` is left out."""
    nodes = {p.stem if p.is_file() else p.name: p for p in folder.iterdir()
             if (p.suffix == ".rs" and p.name != "mod.rs") or (p.is_dir() and (p / "mod.rs").exists())}
    prefix = "crate::" + "::".join(folder.relative_to(ROOT / "src").parts) + "::"
    edges = {n: set() for n in nodes}
    for name, path in nodes.items():
        files = [path] if path.is_file() else sorted(path.rglob("*.rs"))
        for f in files:
            src = f.read_text().split("#[cfg(test)]")[0]
            # Inside a sub-folder, `super::` names the sub-folder's own children.
            sup = r"\bsuper::" if path.is_file() or f.parent != path else r"\bsuper::super::"
            used = set(re.findall(sup + r"([a-z_][a-z0-9_]*)", src))
            used |= set(re.findall(re.escape(prefix) + r"([a-z_][a-z0-9_]*)", src))
            for group in re.findall(sup + r"\{([^}]*)\}", src, re.S):
                used |= {m.group(1) for m in re.finditer(r"(?:^|,)\s*([a-z_][a-z0-9_]*)", group)}
            edges[name] |= {u for u in used if u in nodes and u != name}
    return edges


def cycles(edges):
    """One cycle per strongly connected group of two or more nodes (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    bad = 0
    for folder in sorted(p.parent for p in (ROOT / "src").rglob("mod.rs")):
        for group in cycles(file_arrows(folder)):
            rel = folder.relative_to(ROOT)
            print(f"check-deps: files of {rel}/ use each other in a circle: {', '.join(group)}")
            bad += 1
    all_arrows = arrows()
    for (a, b), files in sorted(all_arrows.items()):
        if a not in LAYER and a not in LEAVES:
            continue
        if not allowed(a, b):
            print(f"check-deps: {a} -> {b} points against the direction: {', '.join(sorted(set(files)))}")
            bad += 1
    for rel, what in answers_below_http():
        print(f"check-deps: {rel} builds {what} below http/; return typed data and render it in http/")
        bad += 1
    for rel, n, spelled in statuses_spelled():
        print(f"check-deps: {rel}:{n} spells the status {spelled}; use src/status.rs "
              "(RequestStatus, StepStatus, status_sql!)")
        bad += 1
    if bad == 0:
        print(f"check-deps: {len(all_arrows)} arrows between modules, all in the direction; "
              "answers built only in http/; statuses spelled only in src/status.rs")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

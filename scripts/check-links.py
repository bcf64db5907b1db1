#!/usr/bin/env python3
"""Checks the relative links of the README, ARCHITECTURE.md, the guide under docs/ and perf/
(perf/README.md and every record and README under perf/runs/).

Every Markdown link `[text](target)` or `[text](target#anchor)` whose target is not
external (http:, https:, mailto:) must name a file or directory that exists, relative to
the file that links it, and an anchor must match a heading of the Markdown file it
points into, by GitHub's rules: lowercase, spaces to '-', punctuation other than '-' and
'_' removed, a repeated heading numbered (-1, -2, ...). Links and headings inside fenced
code blocks and inline code are not links or headings. Exits 1 naming file:line and the
link for each bad one; 0 when every link is good.

    scripts/check-links.py
"""

import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# `[text](target)`, with an optional title; the text may hold inline code and, for an
# image inside a link, one level of brackets.
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^()\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
HTML_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
EXTERNAL = ("http:", "https:", "mailto:")


def files_to_check():
    """README.md, ARCHITECTURE.md and every .md under docs/ and perf/, in a stable order."""
    out = [p for p in ("README.md", "ARCHITECTURE.md") if os.path.exists(os.path.join(ROOT, p))]
    for top in ("docs", "perf"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = sorted(d for d in dirnames if d != "target")
            for name in sorted(filenames):
                if name.endswith(".md"):
                    out.append(os.path.relpath(os.path.join(dirpath, name), ROOT))
    return out


def prose_lines(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield n, line


def slug(heading):
    """GitHub's anchor of a heading's text."""
    # A link in a heading counts by its text; inline code by its content.
    text = LINK.sub(lambda m: m.group(1), heading)
    text = CODE_SPAN.sub(lambda m: m.group(2), text)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    """Every anchor a Markdown file offers: its headings' slugs and explicit HTML ids."""
    if path not in _anchors:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        seen, found = {}, set()
        for _, line in prose_lines(text):
            found.update(HTML_ID.findall(line))
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        _anchors[path] = found
    return _anchors[path]


def links(line):
    """The links of one line that are not inside inline code, as (target)."""
    spans = [m.span() for m in CODE_SPAN.finditer(line)]
    for m in LINK.finditer(line):
        if any(a <= m.start() < b for a, b in spans):
            continue
        yield m.group(2)
        # An image inside a link's text is a link too.
        for inner in LINK.finditer(m.group(1)):
            yield inner.group(2)


def check(rel):
    """The bad links of one file, as messages."""
    path = os.path.join(ROOT, rel)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    bad = []
    for n, line in prose_lines(text):
        for target in links(line):
            if target.lower().startswith(EXTERNAL):
                continue
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(dest):
                bad.append(f"{rel}:{n}: {target}: no such file")
            elif anchor and dest.endswith(".md") and os.path.isfile(dest) and anchor not in anchors(dest):
                bad.append(f"{rel}:{n}: {target}: no heading '#{anchor}' in {os.path.relpath(dest, ROOT)}")
    return bad


def main():
    bad = [msg for rel in files_to_check() for msg in check(rel)]
    for msg in bad:
        print(msg)
    if bad:
        print(f"check-links: {len(bad)} bad link(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

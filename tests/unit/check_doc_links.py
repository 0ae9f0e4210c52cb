#!/usr/bin/env python3
"""Checks the project's Markdown links: every relative link names a file or
folder that exists, and every #anchor names a heading of its target, as
GitHub renders it. Usage: check_doc_links.py REPO_ROOT. Exit 0: all resolve;
1: one line per broken link."""
import os
import re
import sys

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
SKIP_DIRS = {"generated", "node_modules"}  # and build*, .* (below)


def markdown_files(root):
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith(("build", "."))]
        for f in files:
            if f.endswith(".md"):
                yield os.path.join(d, f)


def prose_lines(path):
    """The file's lines outside fenced code blocks, with their numbers."""
    fenced = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if not fenced:
                yield n, line


def slug(heading):
    """GitHub's anchor for a heading: lower case, markup and punctuation
    dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen, found = {}, set()
        for _, line in prose_lines(path):
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            s = slug(m.group(1))
            k = seen.get(s, 0)
            seen[s] = k + 1
            found.add(s if k == 0 else f"{s}-{k}")
        _anchors[path] = found
    return _anchors[path]


def broken_links(root):
    for md in sorted(markdown_files(root)):
        lines = list(prose_lines(md))
        text = "".join(re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), line) for _, line in lines)
        starts, pos = [], 0  # each prose line's offset in text, for the link's line number
        for _, line in lines:
            starts.append(pos)
            pos += len(line)
        for m in LINK.finditer(text):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, ...
                continue
            i = max(k for k, s in enumerate(starts) if s <= m.start(1))
            where = f"{os.path.relpath(md, root)}:{lines[i][0]}"
            file_part, _, anchor = target.partition("#")
            dest = md if not file_part else os.path.normpath(os.path.join(os.path.dirname(md), file_part))
            if not os.path.exists(dest):
                yield f"{where}: {target}: no such file"
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                yield f"{where}: {target}: no heading with that anchor in {os.path.relpath(dest, root)}"


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    bad = list(broken_links(root))
    for b in bad:
        print(b)
    if bad:
        print(f"{len(bad)} broken link(s): fix the link or the heading it names")
        return 1
    print("all relative links resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())

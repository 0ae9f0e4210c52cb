"""Version ranges and values that change by version.

A range is written "9" (just 9), "6-8", "9-" (9 and later) or "-8" (8 and
earlier); both ends are inclusive. A versioned value is either a plain value
(the same in every version) or a table from ranges to values, for example
    type = { "-8" = "int", "9-" = "size_t" }
Ranges of one table must not overlap, and every version in which the owner
exists must be covered.
"""

import re

from .spec import Node

_RANGE = re.compile(r"^(\d+)?(-)?(\d+)?$")


class VRange:
    def __init__(self, lo, hi, text):
        self.lo, self.hi, self.text = lo, hi, text

    def __contains__(self, v):
        return (self.lo is None or v >= self.lo) and (self.hi is None or v <= self.hi)

    def overlaps(self, other):
        lo = max(self.lo if self.lo is not None else -1, other.lo if other.lo is not None else -1)
        hi = min(self.hi if self.hi is not None else 1 << 30, other.hi if other.hi is not None else 1 << 30)
        return lo <= hi


def parse_range(text, node, key):
    m = _RANGE.match(text.replace(" ", ""))
    if not m or (m.group(1) is None and m.group(3) is None):
        raise node.error(f"'{text}' is not a version range (write \"9\", \"6-8\", \"9-\" or \"-8\")", key)
    lo = int(m.group(1)) if m.group(1) else None
    hi = int(m.group(3)) if m.group(3) else None
    if not m.group(2):
        hi = lo
    if lo is not None and hi is not None and lo > hi:
        raise node.error(f"version range '{text}' is empty", key)
    return VRange(lo, hi, text)


def check_disjoint(ranges, node, what="version ranges"):
    """ranges: list of (VRange, key path label)."""
    for i, (a, _) in enumerate(ranges):
        for b, bkey in ranges[i + 1:]:
            if a.overlaps(b):
                raise node.error(f"overlapping {what} '{a.text}' and '{b.text}'", bkey)


class VMap:
    """A value that may differ by version."""

    def __init__(self, node, entries):
        self.node = node          # where it was written, for messages
        self.entries = entries    # list of (VRange or None, value)

    @classmethod
    def parse(cls, parent, key, check):
        """Reads parent[key]; check(value, node, key) validates one value."""
        node = parent.child(key)
        if isinstance(node.data, dict):
            if not node.data:
                raise parent.error("empty version table", key)
            entries = []
            for rkey, _ in node.items():
                r = parse_range(rkey, node, rkey)
                check(node.data[rkey], node, rkey)
                entries.append((r, node.data[rkey]))
            check_disjoint([(r, r.text) for r, _ in entries], node)
            return cls(node, entries)
        check(node.data, parent, key)
        return cls(node, [(None, node.data)])

    @classmethod
    def const(cls, node, value):
        return cls(node, [(None, value)])

    def at(self, v, what):
        for r, value in self.entries:
            if r is None or v in r:
                return value
        raise self.node.error(f"no {what} for version {v} (covered: "
                              f"{', '.join(r.text for r, _ in self.entries)})")

    def is_versioned(self):
        return self.entries[0][0] is not None

    def values(self):
        return [v for _, v in self.entries]


def read_since_until(node):
    since = node.get("since", int)
    until = node.get("until", int)
    if since is not None and until is not None and since > until:
        raise node.error(f"since = {since} is later than until = {until}", "until")
    return since, until


def active(since, until, v):
    return (since is None or v >= since) and (until is None or v <= until)


def string_check(value, node, key):
    if not isinstance(value, str):
        raise node.error(f"expected a string, got {value!r}", key)


def choice_check(choices):
    def check(value, node, key):
        if value not in choices:
            raise node.error(f"'{value}' is not one of: {', '.join(sorted(choices))}", key)
    return check


__all__ = ["VRange", "VMap", "Node", "parse_range", "check_disjoint", "read_since_until", "active",
           "string_check", "choice_check"]

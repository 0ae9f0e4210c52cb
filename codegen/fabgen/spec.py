"""Strict access to parsed TOML: unknown keys, wrong types and missing keys
raise SpecError naming the spec file and the key path."""

import os

try:
    import tomllib  # Python 3.11 and later
except ImportError:  # 3.9 and 3.10 (RHEL 9, Amazon Linux 2023, Ubuntu 22.04): the same parser, packaged as tomli
    try:
        import tomli as tomllib
    except ImportError:
        raise SystemExit("codegen: reading the specs needs Python 3.11's tomllib or, on Python 3.9 and 3.10, the tomli "
                         "package (pip install tomli, or the distribution's python3-tomli)") from None


class SpecError(Exception):
    """A problem in a spec, reported as '<file>: <key path>: <what is wrong>'."""

    def __init__(self, file, path, message):
        super().__init__(f"{file}: {path}: {message}")
        self.file, self.path, self.message = file, path, message


def display_path(path):
    """A short, stable name for a file in messages and banners."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def load_toml(path, label=None):
    label = label or display_path(path)
    try:
        with open(path, "rb") as f:
            return Node(label, "", tomllib.load(f))
    except tomllib.TOMLDecodeError as e:
        raise SpecError(label, "(syntax)", str(e)) from None
    except OSError as e:
        raise SpecError(label, "(file)", e.strerror) from None


_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", list: "a list", dict: "a table"}


class Node:
    """A table (or value) of a spec together with where it came from."""

    def __init__(self, file, path, data):
        self.file, self.path, self.data = file, path, data

    def error(self, message, key=None):
        return SpecError(self.file, self.sub(key) if key is not None else (self.path or "(top)"), message)

    def sub(self, key):
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else str(key)

    def is_table(self):
        return isinstance(self.data, dict)

    def keys(self, allowed, required=()):
        """Rejects unknown keys and reports missing required ones."""
        if not isinstance(self.data, dict):
            raise self.error("expected a table")
        for k in self.data:
            if k not in allowed:
                raise self.error(f"unknown key '{k}' (allowed: {', '.join(sorted(allowed))})", k)
        for k in required:
            if k not in self.data:
                raise self.error(f"missing required key '{k}'")
        return self

    def has(self, key):
        return key in self.data

    def child(self, key, label=None):
        return Node(self.file, self.sub(label if label is not None else key), self.data[key])

    def items(self):
        for k in self.data:
            yield k, self.child(k)

    def elements(self, label=None):
        """Children of a list; label(i, value) may name an element in paths."""
        if not isinstance(self.data, list):
            raise self.error(f"expected a list, got {_describe(self.data)}")
        for i, v in enumerate(self.data):
            name = label(i, v) if label else None
            path = f"{self.path}[{name}]" if name is not None else f"{self.path}[{i}]"
            yield Node(self.file, path, v)

    def get(self, key, kind, default=None, required=False):
        if key not in self.data:
            if required:
                raise self.error(f"missing required key '{key}'")
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        ok = any(isinstance(value, k) and not (k is int and isinstance(value, bool)) for k in kinds)
        if not ok:
            wanted = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
            raise self.error(f"expected {wanted}, got {_describe(value)}", key)
        return value


def _describe(value):
    for t, name in _TYPE_NAMES.items():
        if isinstance(value, t) and not (t is int and isinstance(value, bool)):
            return f"{name} ({value!r})" if t in (str, int, bool) else name
    return type(value).__name__

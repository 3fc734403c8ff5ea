#!/usr/bin/env python3
"""The file-level import drawing of a crate: which source files import which.

    scripts/imports.py crates/sessionizer/src [--max N]

A file imports another when it names a path into it: `use crate::a::b`, a `crate::`
or `super::` path in code, or a `use child::...` of a module it declares. Comments,
doc links and `#[cfg(test)] mod tests` are left out; `mod x;` declarations are not
imports. Prints every circle (a strongly connected set of files, largest first) and
exits 1 when one has more than N files (default 3), the layout's rule.
"""

import os
import re
import sys


def modules(root):
    files = {}
    for d, _, names in os.walk(root):
        for f in names:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(d, f)
            mod = os.path.relpath(path, root)[:-3].replace(os.sep, "::")
            if mod.endswith("::mod"):
                mod = mod[: -len("::mod")]
            if mod in ("lib", "main"):
                mod = ""
            files[mod] = path
    return files


def reexports(path, here, parent):
    """`pub use` items of a module: name -> the full path it stands for."""
    src = open(path, encoding="utf-8").read()
    src = re.sub(r"//.*$", "", src, flags=re.M)
    found = {}
    for prefix, group in re.findall(r"\bpub(?:\([\w:]+\))?\s+use\s+([\w:]+?)::\{([^}]*)\}", src):
        for item in group.split(","):
            item = item.strip()
            if item and re.fullmatch(r"\w+", item):
                found[item] = absolute(prefix + "::" + item, here, parent)
    for full in re.findall(r"\bpub(?:\([\w:]+\))?\s+use\s+([\w:]+::\w+)\s*;", src):
        found[full.split("::")[-1]] = absolute(full, here, parent)
    return found


def absolute(path, here, parent):
    """A path as written in a module (`crate::`, `super::`, or relative) from the root."""
    if path.startswith("crate::"):
        return path[len("crate::"):]
    if path.startswith("super::"):
        return (parent + "::" + path[len("super::"):]).strip(":")
    if path.startswith("self::"):
        path = path[len("self::"):]
    return (here + "::" + path).strip(":")


def drawing(root):
    files = modules(root)
    places = {}
    for m, path in files.items():
        is_dir = path.endswith("mod.rs") or path.endswith("lib.rs")
        here = m if is_dir else "::".join(m.split("::")[:-1])
        # `super` of a module file (mod.rs) is its parent; of a leaf file, its folder's
        # module.
        sup = "::".join(here.split("::")[:-1]) if is_dir else here
        places[m] = (here, sup)
    aliases = {m: reexports(path, *places[m]) for m, path in files.items()}

    def resolve(path, depth=0):
        parts = [p for p in path.split("::") if p]
        for i in range(len(parts), -1, -1):
            m = "::".join(parts[:i])
            if m in files:
                rest = parts[i:]
                if rest and depth < 8 and rest[0] in aliases[m]:
                    target = aliases[m][rest[0]]
                    found = resolve(target, depth + 1)
                    if found is not None:
                        return found
                return m
        return None

    edges = {m: set() for m in files}
    for m, path in files.items():
        src = open(path, encoding="utf-8").read()
        src = re.sub(r"#\[cfg\((?:all\()?test\b[^\]]*\]\s*mod tests\s*\{.*", "", src, flags=re.S)
        src = re.sub(r"//.*$", "", src, flags=re.M)
        here, parent = places[m]
        children = set(re.findall(r"^\s*(?:pub(?:\([\w:]+\))?\s+)?mod\s+(\w+)\s*;", src, flags=re.M))
        targets = re.findall(r"\bcrate((?:::\w+)+)", src)
        targets += [(parent + "::" + t) for t in re.findall(r"\bsuper::(\w+(?:::\w+)*)", src)]
        # Grouped imports, `use super::{a::B, C}`: each item.
        for start, path, group in re.findall(r"\b(crate|super)((?:::\w+)*)::\{([^{}]*)\}", src):
            base = ("" if start == "crate" else parent) + path
            for item in group.split(","):
                item = item.strip().split(" as ")[0].strip()
                if item and item != "self":
                    targets.append(base + "::" + item)
        for child in re.findall(r"\buse\s+(?:self::)?(\w+)::", src):
            if child in children:
                targets.append(here + "::" + child)
        for t in targets:
            r = resolve(t)
            if r is not None and r != m:
                edges[m].add(r)
    return edges


def circles(edges):
    sys.setrecursionlimit(100000)
    index, low, stack, on, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found, key=len, reverse=True)


def main():
    args = sys.argv[1:]
    limit = 3
    if "--max" in args:
        i = args.index("--max")
        limit = int(args[i + 1])
        del args[i : i + 2]
    worst = 0
    for root in args:
        for c in circles(drawing(root)):
            worst = max(worst, len(c))
            print(f"{root}: {len(c)} files: {', '.join(x or '(root)' for x in c)}")
    sys.exit(1 if worst > limit else 0)


if __name__ == "__main__":
    main()

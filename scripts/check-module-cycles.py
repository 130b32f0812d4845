#!/usr/bin/env python3
"""Fails when a module imports one that imports it back, directly or around a loop.

Each crate's modules are its source files (`a/b.rs` and `a/b/mod.rs` are `a::b`). A file
depends on another when it names one of its paths: `crate::a::b`, `super::x` or a `use` of
either, resolved to the longest module the path names. A module's own ancestors (lib.rs,
mod.rs) are not counted: a child using what its parent declares is how Rust nests modules,
and the parent is the module that owns the child. Cycles among everything else are reported
with the lines that close them; the exit code is 1 when there is one.

Usage: scripts/check-module-cycles.py [CRATE_DIR...]   (default: every workspace member)
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def members():
    text = open(os.path.join(ROOT, "Cargo.toml")).read()
    block = re.search(r"members\s*=\s*\[(.*?)\]", text, re.S).group(1)
    return re.findall(r'"([^"]+)"', block)


def strip_comments(src):
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    out = []
    for line in src.splitlines():
        # Drop `//` comments, but not inside a string (good enough: paths never hold `"//`).
        # Doc comments stay: an intra-doc link (`[`crate::x`]`) is a reference too.
        i = line.find("//")
        if i >= 0 and line[:i].count('"') % 2 == 0 and line[i:i + 3] not in ("///", "//!"):
            line = line[:i]
        out.append(line)
    return "\n".join(out)


def strip_test_mods(src):
    """Remove inline `#[cfg(test)] mod x { ... }` blocks: tests may reach anywhere."""
    out, i = [], 0
    pat = re.compile(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{")
    while True:
        m = pat.search(src, i)
        if not m:
            out.append(src[i:])
            return "".join(out)
        out.append(src[i:m.start()])
        depth, j = 1, m.end()
        while j < len(src) and depth:
            depth += {"{": 1, "}": -1}.get(src[j], 0)
            j += 1
        i = j


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree).replace("::self", "")
    m = re.match(r"^(.*?)\{(.*)\}$", tree)
    if not m:
        return [tree]
    prefix, inner = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    return [p for part in parts if part for p in expand_use(prefix + part)]


def crate_modules(src_dir):
    mods = {}
    for dirpath, _, files in os.walk(src_dir):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src_dir)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib", "main"):
                rel = rel[:-1]
            mods[tuple(rel)] = os.path.join(dirpath, f)
    return mods


def resolve(path, here, mods):
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate":
        base, segs = (), segs[1:]
    elif segs[0] in ("super", "self"):
        base = here
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    else:
        return None
    full = base + tuple(segs)
    for n in range(len(full), -1, -1):
        if full[:n] in mods:
            return full[:n]
    return None


def deps(mods):
    graph = {}
    for mod, file in mods.items():
        src = strip_test_mods(strip_comments(open(file, encoding="utf-8").read()))
        paths = []
        for m in re.finditer(r"\buse\s+([^;]+);", src):
            paths += expand_use(m.group(1))
        paths += re.findall(r"\b((?:crate|super)(?:::\w+)+)", src)
        edges = {}
        for p in paths:
            t = resolve(p, mod, mods)
            # Ancestors and the module itself are not edges (see the module doc).
            if t is None or t == mod[: len(t)]:
                continue
            edges.setdefault(t, p)
        graph[mod] = edges
    return graph


def cycles(graph):
    """Tarjan's strongly connected components with more than one module."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
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
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def collapse(graph, depth):
    """The same graph seen from `depth` levels down: `a::b::c` counts as `a::b` at depth 2."""
    out = {}
    for a, edges in graph.items():
        ca = a[:depth]
        for b, via in edges.items():
            cb = b[:depth]
            if ca == cb or cb == ca[: len(cb)] or ca == cb[: len(ca)]:
                continue
            out.setdefault(ca, {}).setdefault(cb, via)
        out.setdefault(ca, {})
    return out


def name(mod):
    return "::".join(mod) or "(crate root)"


def main():
    crates = sys.argv[1:] or members()
    bad = 0
    for crate in crates:
        src = os.path.join(ROOT, crate, "src")
        if not os.path.isdir(src):
            continue
        graph = deps(crate_modules(src))
        deepest = max((len(m) for m in graph), default=0)
        seen = set()
        found = []
        # Folders too: `deploy/` -> `raid/md.rs` and `raid/` -> `deploy/` is a circle of folders.
        for depth in range(deepest, 0, -1):
            g = collapse(graph, depth)
            for comp in cycles(g):
                key = tuple(comp)
                if key not in seen:
                    seen.add(key)
                    found.append((g, comp))
        for graph, comp in found:
            bad += 1
            print(f"{crate}: import circle among {', '.join(name(m) for m in comp)}")
            for a in comp:
                for b, via in graph[a].items():
                    if b in comp:
                        print(f"    {name(a)} -> {name(b)}  ({via})")
    if bad:
        print(f"{bad} import circle(s); cut each by moving what both sides need below them")
        return 1
    print(f"no import circles in {len(crates)} crates")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The layering check: every `use` edge of the workspace against the floors that
docs/ARCHITECTURE.md writes down (its ```floors block).

Three rules, each failing the run with the edges at fault:
1. Crates: a crate's [dependencies] name only crates on lower floors.
2. Modules of hookscope-core: a module imports only modules on lower floors; a module's files
   import each other without a circle.
3. Backends: only the modules the floors block lists under `backend:` name `burn::backend`.

Usage: python3 .ci/layers.py [REPO]   (exit 1 on a violation)
"""

import re
import sys
from pathlib import Path

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)


def floors_block():
    """The floors block: {'crates': [[names...] per floor], 'core': [...], 'backend': [...]}."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    match = re.search(r"```floors\n(.*?)```", text, re.S)
    if not match:
        sys.exit("docs/ARCHITECTURE.md has no ```floors block")
    sections, current = {}, None
    for line in match.group(1).splitlines():
        line = line.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if not line.startswith(" "):
            current = line.rstrip(":").strip()
            sections[current] = []
        else:
            sections[current].append(line.split())
    return sections


def floor_of(rows):
    """name -> floor index (the first token of a row is its floor number)."""
    floors = {}
    for row in rows:
        level = int(row[0])
        for name in row[1:]:
            floors[name] = level
    return floors


def strip_code(text):
    """Source without comments, string literals and the trailing `#[cfg(test)] mod tests`."""
    tests = re.search(r"#\[cfg\(test\)\]\s*mod tests\b", text)
    if tests:
        text = text[: tests.start()]
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"r#*\"(?:.|\n)*?\"#*", '""', text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return re.sub(r"//[^\n]*", "", text)


def expand(tree):
    """`a::{b, c::{d as f, e}}` -> ['a::b', 'a::c::d@f', 'a::c::e'] (`@` marks a rename)."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+", "@", tree))
    if "{" not in tree:
        return [tree]
    head, rest = tree.split("{", 1)
    if "}" not in rest:
        return []  # not a use tree (the word `use` in a macro or doc text)
    body = rest[: rest.rindex("}")]
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    parts.append(body[start:])
    return [head + sub for part in parts if part for sub in expand(part)]


def paths_in(code):
    """Every path a file names: its `use` trees expanded, and inline `crate::`/`super::` paths."""
    found = []
    for tree in re.findall(r"\buse\s+([^;]+);", code):
        found += [path.split("@")[0] for path in expand(tree)]
    found += re.findall(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)", code)
    return found


def module_path(src, file):
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib"):
        parts.pop()
    return parts


def resolve(path, here):
    """A path's target as module segments from the crate root (None outside the crate)."""
    segments = path.split("::")
    if segments[0] == "crate":
        return segments[1:]
    base = list(here)
    if segments[0] == "self":
        return list(here) + segments[1:]
    while segments and segments[0] == "super":
        segments.pop(0)
        base = base[:-1]
    return base + segments


def reexports(modules):
    """(module, name) -> the child module a `mod.rs`/`lib.rs` re-exports `name` from."""
    found = {}
    for file, here in modules.items():
        if file.name not in ("mod.rs", "lib.rs"):
            continue
        for tree in re.findall(r"\bpub(?:\([\w:]+\))?\s+use\s+([^;]+);", strip_code(file.read_text())):
            for path in expand(tree):
                segments = path.split("::")
                if len(segments) >= 2 and segments[0] not in ("crate", "super", "self"):
                    name = segments[-1].split("@")[-1]
                    found[(tuple(here), name)] = tuple(here) + (segments[0],)
    return found


def core_edges(src, modules):
    """(file module, target file module) for every edge between files of the crate. A name a
    `mod.rs` re-exports counts as an edge to the file defining it; a `mod.rs`'s own re-exports
    of its children are declarations, not edges."""
    known = {tuple(m) for m in modules.values()}
    hubs = reexports(modules)
    edges = set()
    for file, here in modules.items():
        here = tuple(here)
        is_mod = file.name in ("mod.rs", "lib.rs")
        for path in paths_in(strip_code(file.read_text())):
            target = resolve(path, here)
            for cut in range(len(target), 0, -1):
                prefix = tuple(target[:cut])
                if prefix in known:
                    if cut < len(target) and (prefix, target[cut]) in hubs:
                        prefix = hubs[(prefix, target[cut])]
                    is_child = is_mod and prefix[: len(here)] == here
                    if prefix != here and not is_child:
                        edges.add((here, prefix))
                    break
    return edges


def find_cycle(nodes, edges):
    graph = {n: sorted(b for a, b in edges if a == n) for n in nodes}
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in graph.get(n, []):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                cycle = visit(m)
                if cycle:
                    return cycle
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(nodes):
        if n not in state:
            cycle = visit(n)
            if cycle:
                return cycle
    return None


def crate_dependencies():
    """crate name -> workspace crates its [dependencies] name."""
    manifests = [p for p in ROOT.glob("**/Cargo.toml") if "target" not in p.parts and p.parent != ROOT]
    names = {}
    for manifest in manifests:
        match = re.search(r'^\[package\][^\[]*?^name\s*=\s*"([^"]+)"', manifest.read_text(), re.M | re.S)
        if match:
            names[match.group(1)] = manifest
    deps = {}
    for name, manifest in names.items():
        text = manifest.read_text()
        section = re.search(r"^\[dependencies\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
        listed = re.findall(r"^([\w-]+)\s*[.=]", section.group(1), re.M) if section else []
        deps[name] = [d for d in listed if d in names]
    return deps


def main():
    block = floors_block()
    errors = []

    crate_floor = floor_of(block["crates"])
    for crate, deps in sorted(crate_dependencies().items()):
        if crate not in crate_floor:
            errors.append(f"crate {crate} has no floor in docs/ARCHITECTURE.md")
            continue
        for dep in deps:
            if crate_floor.get(dep, 99) >= crate_floor[crate]:
                errors.append(f"crate {crate} (floor {crate_floor[crate]}) depends on {dep} (floor {crate_floor.get(dep)})")

    src = ROOT / "crates" / "core" / "src"
    modules = {file: module_path(src, file) for file in sorted(src.rglob("*.rs"))}
    edges = core_edges(src, modules)
    module_floor = floor_of(block["core"])
    for file, here in modules.items():
        if here and here[0] not in module_floor:
            errors.append(f"core module `{here[0]}` ({file.relative_to(ROOT)}) has no floor in docs/ARCHITECTURE.md")
    for a, b in sorted(edges):
        if not a or not b or a[0] == b[0]:
            continue
        fa, fb = module_floor.get(a[0]), module_floor.get(b[0])
        if fa is not None and fb is not None and fb >= fa:
            errors.append(f"core: `{'::'.join(a)}` (floor {fa}) uses `{'::'.join(b)}` (floor {fb})")
    cycle = find_cycle({tuple(m) for m in modules.values()}, edges)
    if cycle:
        errors.append("core: import circle " + " -> ".join("::".join(m) or "lib" for m in cycle))

    allowed = {name for row in block["backend"] for name in row}
    for file, here in modules.items():
        if "burn::backend" in strip_code(file.read_text()):
            if not here or here[0] not in allowed:
                errors.append(f"core: {file.relative_to(ROOT)} names `burn::backend` (only {sorted(allowed)} may)")

    if errors:
        print("layering check failed:", *errors, sep="\n  ")
        sys.exit(1)
    print(f"layering check: {len(crate_floor)} crates, {len(modules)} core files, {len(edges)} edges, no violation")


if __name__ == "__main__":
    main()

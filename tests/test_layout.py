"""The source layout's rules, checked on the source itself (docs/DESIGN.md, "The map of the
lobby's source"): a layout that only a document states drifts with the first hurried change.

- The lobby's folders and top-level files are exactly those DESIGN.md's map lists.
- No two sibling modules import each other, in any Rust crate: words two files share live in
  their parent module or in a leaf. No exception: each part of the lobby is handed a context
  of its own, made of what it needs, by the lobby's start (`run.rs`), which nothing imports.
- Client connections and workers meet only through the queue: neither imports the other.
- Every raw system call is in `crates/sys`: it alone has `unsafe` blocks, the lobby forbids
  unsafe code, the Python extension denies it (and allows its one CPython call where it stands).
- No file does two jobs: no code file passes 500 lines before its tests, no Python module 500
  lines; other modules use `maitred.config` through its public names.

The import graph is read from `use` lines and paths (`crate::a::b`, `super::c`, groups in
braces) with comments and `#[cfg(test)]` modules left out: what the compiler resolves.
"""

from __future__ import annotations

import re
import subprocess
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRATES = ROOT / "crates"
LOBBY = CRATES / "lobby" / "src"
MAX_CODE_LINES = 500

Module = tuple[str, ...]


def _module_of(source_root: Path, path: Path) -> Module:
    parts = list(path.relative_to(source_root).with_suffix("").parts)
    if parts[-1] in ("mod", "lib"):
        parts.pop()
    return tuple(parts)


def _code(path: Path) -> str:
    """The file without comments and from its first `#[cfg(test)]` on."""
    text = path.read_text()
    cut = text.find("#[cfg(test)]")
    if cut >= 0:
        text = text[:cut]
    return re.sub(r"//[^\n]*", "", text)


def _source_files(source_root: Path) -> dict[Module, Path]:
    return {
        _module_of(source_root, path): path
        for path in source_root.rglob("*.rs")
        if "tests" not in path.relative_to(source_root).parts
    }


def _imports(source_root: Path) -> dict[Module, set[Module]]:
    """For each module (file), the modules (files) it names."""
    files = _source_files(source_root)

    def resolve(path: list[str]) -> Module | None:
        for length in range(len(path), -1, -1):
            if tuple(path[:length]) in files:
                return tuple(path[:length])
        return None

    edges: dict[Module, set[Module]] = defaultdict(set)
    for module, path in files.items():
        text = _code(path)

        def base(anchor: str, module: Module = module) -> list[str]:
            return [] if anchor == "crate" else list(module)[: -anchor.count("super")]

        for match in re.finditer(r"\b(crate|super(?:::super)*)((?:::\w+)+)", text):
            target = resolve(base(match.group(1)) + match.group(2).split("::")[1:])
            if target is not None and target != module:
                edges[module].add(target)
        for match in re.finditer(r"\b(crate|super(?:::super)*)::((?:\w+::)*)\{([^}]*)\}", text):
            prefix = base(match.group(1)) + [part for part in match.group(2).split("::") if part]
            for item in match.group(3).split(","):
                name = item.strip().split(" as ")[0]
                target = resolve(prefix + ([] if name in ("", "self") else name.split("::")))
                if target is not None and target != module:
                    edges[module].add(target)
    return edges


def _sibling_cycles(source_root: Path) -> list[str]:
    """Pairs of sibling modules (files or folders under one parent) that import each other;
    a folder imports what any file in it imports."""
    cycles = []
    edges = _imports(source_root)
    parents = {module[:-1] for module in _source_files(source_root) if module}
    for parent in parents:
        depth = len(parent)
        reach: dict[Module, set[Module]] = defaultdict(set)
        for source, targets in edges.items():
            for target in targets:
                if source[:depth] != parent or target[:depth] != parent:
                    continue
                if len(source) <= depth or len(target) <= depth:
                    continue  # the parent itself: its children may use its shared words
                a, b = source[: depth + 1], target[: depth + 1]
                if a != b:
                    reach[a].add(b)
        for a, targets in reach.items():
            for b in targets:
                if a < b and a in reach.get(b, set()):
                    cycles.append(f"{'/'.join(a)} <-> {'/'.join(b)}")
    return sorted(cycles)


def _crates() -> list[Path]:
    return sorted(path for path in CRATES.iterdir() if (path / "src" / "lib.rs").exists())


def test_the_lobby_is_laid_out_as_design_md_maps_it():
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    section = design.split("## The map of the lobby's source", 1)[1].split("\n## ", 1)[0]
    mapped = set(re.findall(r"^\| `([\w./]+)` \|", section, re.MULTILINE))
    present = {path.name + "/" if path.is_dir() else path.name for path in LOBBY.iterdir()}
    assert mapped == present, f"only in DESIGN.md: {mapped - present}; only in the tree: {present - mapped}"


def test_each_folder_s_row_names_exactly_the_files_in_it():
    """Within a folder's row of DESIGN.md's map, "what it holds" names each of its files (a
    `mod.rs` may go unnamed: the folder's own words), in any subfolder too, and no file that is
    not there: a map that names folders only drifts file by file."""
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    section = design.split("## The map of the lobby's source", 1)[1].split("\n## ", 1)[0]
    problems = []
    for folder, holds in re.findall(r"^\| `(\w+)/` \| (.*?) \|", section, re.MULTILINE):
        named = set(re.findall(r"`(?:[\w/]+/)?(\w+\.rs)`", holds))
        files = {path.name for path in (LOBBY / folder).rglob("*.rs")}
        if unnamed := sorted(files - named - {"mod.rs"}):
            problems.append(f"{folder}/: not named in its row: {', '.join(unnamed)}")
        if missing := sorted(named - files):
            problems.append(f"{folder}/: named in its row, not in the folder: {', '.join(missing)}")
    assert not problems, "\n".join(problems)


def _may_import_column() -> dict[str, str]:
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    section = design.split("## The map of the lobby's source", 1)[1].split("\n## ", 1)[0]
    return {
        name.rstrip("/").removesuffix(".rs"): row.rsplit(" | ", 1)[1]
        for name, row in re.findall(r"^\| `([\w./]+)` \| (.*) \|$", section, re.MULTILINE)
    }


def test_each_part_imports_only_what_its_row_says_and_all_of_it():
    """DESIGN.md's "may import" column, read as the modules named in backquotes (a folder, or a
    file such as `client/proxies.rs`): every module a part imports outside itself is one of
    them or inside one, and each one named is imported. "everything" is not checked;
    "nothing of the lobby's" is none."""
    edges = _imports(LOBBY)
    problems = []
    for part, column in _may_import_column().items():
        if column == "everything":
            continue
        # A module as _imports names it: `client/proxies.rs` is client/proxies, `lib.rs` the root.
        named = {"" if name == "lib.rs" else name.removesuffix(".rs") for name in re.findall(r"`([\w/.]+)`", column)}
        imported = {
            "/".join(target)
            for source, targets in edges.items()
            if source[:1] == (part,)
            for target in targets
            if target[:1] != (part,)
        }

        def within(module: str, name: str) -> bool:
            return module == name or (name != "" and module.startswith(name + "/"))

        if unlisted := sorted(m for m in imported if not any(within(m, name) for name in named)):
            problems.append(f"{part}: imports {', '.join(m or 'lib.rs' for m in unlisted)}, not in its row")
        if unused := sorted(n for n in named if not any(within(m, n) for m in imported)):
            problems.append(
                f"{part}: its row names {', '.join(n or 'lib.rs' for n in unused)}, which it does not import"
            )
    assert not problems, "\n".join(problems)


def test_no_two_sibling_modules_import_each_other():
    found = {}
    for crate in _crates():
        cycles = _sibling_cycles(crate / "src")
        if cycles:
            found[crate.name] = cycles
    assert not found


def test_client_connections_and_workers_meet_only_through_the_queue():
    edges = _imports(LOBBY)
    crossings = sorted(
        f"{'/'.join(source)} -> {'/'.join(target)}"
        for source, targets in edges.items()
        for target in targets
        if (source[:1] == ("client",) and target[:1] in (("worker",), ("supervise",)))
        or (source[:1] == ("worker",) and target[:1] == ("client",))
    )
    assert not crossings


def test_http1_and_http2_meet_only_in_what_they_share():
    """client/h2/ imports nothing of client/http1/, nor it anything of client/h2/: a request's
    rules are the exchange's (client/exchange.rs, crates/protocol's rules.rs), written once, and
    the two meet only in client/opening.rs, which hands a connection from one to the other."""
    edges = _imports(LOBBY)
    sides = (("client", "http1"), ("client", "h2"))
    assert all(any(module[:2] == side for module in edges) for side in sides), "client/http1/ or client/h2/ is gone"
    crossings = sorted(
        f"{'/'.join(source)} -> {'/'.join(target)}"
        for source, targets in edges.items()
        for target in targets
        if {source[:2], target[:2]} == set(sides)
    )
    assert not crossings


def test_unsafe_code_is_only_in_crates_sys():
    assert "#![forbid(unsafe_code)]" in (LOBBY / "lib.rs").read_text()
    assert "#![deny(unsafe_code)]" in (CRATES / "python" / "src" / "lib.rs").read_text()
    outside = []
    for crate in _crates():
        if crate.name == "sys":
            continue
        for path in (crate / "src").rglob("*.rs"):
            text = path.read_text()
            blocks = len(re.findall(r"\bunsafe\s*(\{|fn\b|impl\b)", text))
            allowed = len(re.findall(r"#\[allow\(unsafe_code\)\]", text))
            if blocks > allowed:
                outside.append(str(path.relative_to(ROOT)))
    assert not outside, f"unsafe code outside crates/sys: {outside}"


def test_no_code_file_passes_500_lines_before_its_tests():
    long = {}
    for crate in _crates():
        for path in _source_files(crate / "src").values():
            lines = _code(path).count("\n")
            if lines > MAX_CODE_LINES:
                long[str(path.relative_to(ROOT))] = lines
    assert not long


def test_no_python_module_passes_500_lines_or_reaches_into_config():
    package = ROOT / "python" / "maitred"
    long = {
        str(path.relative_to(ROOT)): n
        for path in package.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_CODE_LINES
    }
    assert not long
    # `maitred top` and the rest use config's public interface (python/maitred/config/__init__.py).
    private = sorted(
        str(path.relative_to(ROOT))
        for path in package.rglob("*.py")
        if "config" not in path.relative_to(package).parts and re.search(r"\bconfig\._[a-z]", path.read_text())
    )
    assert not private


def test_no_tracked_file_holds_a_merge_conflict_marker():
    """A merge resolved in haste once left both sides of a conflict in docs/DESIGN.md's source
    map, markers included, and nothing read it as wrong."""
    listed = subprocess.run(
        ["git", "grep", "-n", "-I", "-E", r"^(<{7} |={7}$|>{7} )", "--", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert listed.returncode in (0, 1), listed.stderr
    assert listed.stdout == "", listed.stdout

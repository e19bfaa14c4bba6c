"""Every code block of README.md and of docs/*.md runs as written: documentation that
drifts fails CI.

The blocks of one page run in page order in one temporary working directory (one per
page) where ``.venv`` links to the environment running the tests, so
``.venv/bin/pathlift ...`` is the literal text a user pastes from the repository root, and
what a block writes stays out of the repository. There ``.venv`` is a folder of links to
the environment's, but for ``bin/pathlift``, which runs each command line in a fork of one
process that imported torch and pathlift once (tests/warm_process.py): the same entry, the
command line's own arguments, environment, folder, streams and exit status, without 1.5 s
of imports each (about 30 command lines). ``python`` blocks run in a fresh
namespace each (no block relies on another's variables); ``bash`` blocks run with
``bash -e -o pipefail``. The HTML comment on the line before a fence marks it:
``<!-- readme-test: slow -->`` (the ``slow`` selection) or
``<!-- readme-test: skip REASON -->``. A block may use files written by earlier blocks of
its page that are not slow: those run first when they have not run yet, so any one block
runs alone.
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

from warm_process import client_script, warm

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"<!--\s*readme-test:\s*(slow|skip)\s*(.*?)\s*-->", re.S)
LANGUAGES = ("python", "bash")


@dataclass(frozen=True)
class Block:
    """One fenced code block: its page, where it starts, its language, its text and mark."""

    page: str
    line: int
    language: str
    text: str
    mark: str | None  # "slow", "skip" or None
    reason: str


def page_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of one page, with the readme-test mark before each."""
    tokens = MarkdownIt().parse(path.read_text())
    page = str(path.relative_to(ROOT))
    blocks = []
    for before, token in zip([None, *tokens], tokens, strict=False):
        if token.type not in ("fence", "code_block"):
            continue
        mark = MARK.search(before.content) if before is not None and \
            before.type == "html_block" else None
        kind, reason = (mark.group(1), " ".join(mark.group(2).split())) if mark else (None, "")
        blocks.append(Block(page, token.map[0] + 1, token.info.strip(), token.content, kind,
                            reason))
    return blocks


BLOCKS = [block for page in PAGES for block in page_blocks(page)]


def _param(block: Block) -> pytest.param:
    marks = {"slow": [pytest.mark.slow],
             "skip": [pytest.mark.skip(reason=block.reason or "marked skip in the page")]}
    return pytest.param(block, id=f"{block.page}:{block.line}-{block.language or 'text'}",
                        marks=marks.get(block.mark, []))


def _repository_state() -> tuple[str, list[str]]:
    """Changes to tracked files (git), and what lies in the repository's runs/ and report/."""
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    written = sorted(str(p.relative_to(ROOT)) for folder in ("runs", "report")
                     for p in (ROOT / folder).rglob("*"))
    return status, written


class Runner:
    """Runs the blocks of every page, each page in its own working directory, each block at
    most once, the earlier fast ones of its page first."""

    def __init__(self, root: Path, server: str) -> None:
        self.root, self.server = root, server
        self.outcome: dict[tuple[str, int], str | None] = {}  # None (passed) or the failure

    def workdir(self, block: Block) -> Path:
        folder = self.root / block.page.replace("/", "_")
        if not folder.exists():
            folder.mkdir()
            self._environment(folder / ".venv")
        return folder

    def _environment(self, venv: Path) -> None:
        """The environment's entries linked, but ``bin/pathlift``: the warm process's client."""
        real = Path(sys.prefix)
        (venv / "bin").mkdir(parents=True)
        for entry in real.iterdir():
            if entry.name != "bin":
                (venv / entry.name).symlink_to(entry)
        for entry in (real / "bin").iterdir():
            if entry.name != "pathlift":
                (venv / "bin" / entry.name).symlink_to(entry)
        client = venv / "bin" / "pathlift"
        client.write_text(client_script(self.server))
        client.chmod(0o755)

    def run_with_prerequisites(self, block: Block) -> None:
        for earlier in BLOCKS:
            if earlier.page != block.page:
                continue
            if earlier.line >= block.line:
                break
            key = (earlier.page, earlier.line)
            if earlier.mark is None and key not in self.outcome:
                self._record(earlier)
            if self.outcome.get(key):
                pytest.fail(f"{earlier.page}:{earlier.line}, which this block may need, failed")
        self._record(block)
        if self.outcome[block.page, block.line]:
            pytest.fail(self.outcome[block.page, block.line], pytrace=False)

    def _record(self, block: Block) -> None:
        key = (block.page, block.line)
        try:
            with pytest.MonkeyPatch.context() as patch:
                patch.chdir(self.workdir(block))
                self.outcome[key] = self._run(block)
        except Exception as err:
            self.outcome[key] = f"{block.page}:{block.line}: {type(err).__name__}: {err}"
            raise

    def _run(self, block: Block) -> str | None:
        """None when the block ran cleanly, else what went wrong."""
        if block.language == "python":
            code = compile(block.text, f"{block.page}:{block.line}", "exec")
            exec(code, {"__name__": "__main__"})
            return None
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.text],
                              cwd=self.workdir(block), capture_output=True, text=True,
                              timeout=1800)
        if done.returncode == 0:
            return None
        return (f"{block.page}:{block.line}: exit status {done.returncode}\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    yield Runner(tmp_path_factory.mktemp("docs"), warm().address)


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_code_block_runs_as_written(block: Block, runner: Runner) -> None:
    assert block.language in LANGUAGES, (
        f"{block.page}:{block.line}: a code block must be one of {LANGUAGES} (or marked "
        f"'<!-- readme-test: skip REASON -->'), got {block.language!r}")
    before = _repository_state()
    runner.run_with_prerequisites(block)
    assert _repository_state() == before, "the block wrote into the repository"


def test_every_mark_stands_before_a_code_block() -> None:
    """A misplaced mark would leave a long block in the default selection."""
    marks = sum(len(MARK.findall(page.read_text())) for page in PAGES)
    assert marks == sum(b.mark is not None for b in BLOCKS)
    assert all(b.reason for b in BLOCKS if b.mark == "skip")
    assert sum(b.language == "python" for b in BLOCKS) >= 20  # the parser sees the blocks
    assert {b.page for b in BLOCKS} >= {"README.md", "docs/your-model-and-data.md"}


def test_readme_is_short_and_cites_the_research_by_name() -> None:
    """The README is a pitch, the set-up, a tour and links (issue 22); no page cites the
    research by file or nickname."""
    readme = PAGES[0].read_text()
    assert len(readme.splitlines()) <= 250
    for page in PAGES:
        text = page.read_text()
        for nickname in ("paper 00", "../shared", "the slides"):
            assert nickname not in text, (page.name, nickname)
        assert not re.search(r"\b[Tt]he thesis\b", text), page.name


def test_no_python_block_holds_a_value_it_does_not_print() -> None:
    """Run as a script, a bare expression (``result.sparsity``, ``a, b``) shows nothing, as
    it would in a notebook: every value a block means to show is printed."""
    import ast

    for block in BLOCKS:
        if block.language != "python":
            continue
        for node in ast.parse(block.text).body:
            assert not (isinstance(node, ast.Expr) and not isinstance(
                node.value, (ast.Call, ast.Constant))), (
                f"{block.page}:{block.line + node.lineno - 1}: bare {ast.unparse(node)!r}")


@pytest.mark.parametrize(("args", "code"), [
    (["norm", "mlp", "-q", "1"], 0), (["norm", "mlp", "--no-such-option"], 2),
    (["norm", "mlp", "--input-shape", "1", "0", "8"], 2)])
def test_the_warm_pathlift_does_what_the_console_script_does(args: list[str], code: int,
                                                             runner: Runner) -> None:
    """The blocks' ``.venv/bin/pathlift`` and the environment's own, on one command line: the
    same output, errors and exit status (a number, a usage error, a refusal)."""
    folder = runner.workdir(BLOCKS[0])
    warm, real = (subprocess.run([str(pathlift), *args], cwd=folder, capture_output=True,
                                 text=True, timeout=300)
                  for pathlift in (folder / ".venv" / "bin" / "pathlift",
                                   Path(sys.prefix, "bin", "pathlift")))
    assert (warm.returncode, warm.stdout, warm.stderr) == \
        (real.returncode, real.stdout, real.stderr)
    assert real.returncode == code

"""The documentation agrees with the op table on what is supported (issue 32: one page listed
ReLU6 as refused and only nearest upsampling, another said both work).

Every list of operations in README.md and docs/*.md is marked by an HTML comment on the
line before it, ``<!-- ops: supported -->`` or ``<!-- ops: refused -->``, and each
operation it names is checked against the registry of ``pathlift.graph.ops`` (the module
classes, functions and tensor methods it maps to handlers). A paragraph naming four or
more module classes without a mark fails, so a new list cannot drift unchecked. The table of
docs/networks.md names every supported operation of the table.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from pathlift.graph.ops.base import FUNCTIONS, METHODS, MODULES, supported_table

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"<!--\s*ops:\s*(supported|refused)\s*-->")
# the table of docs/timm.md is written by tests/timm_scan.py from pathlift's own verdicts
# on timm's models (the ops the engine named when it refused them): its prose is checked,
# the table between these markers is the scan's
GENERATED = re.compile(r"<!-- timm-table: start -->.*?<!-- timm-table: end -->", re.S)
# words that name an op of the table but are used as plain words in the docs: the modes of
# F.interpolate (F.bilinear, refused, is a product of two inputs)
MODE_WORDS = {"nearest", "linear", "bilinear", "bicubic", "trilinear", "area"}
_DIMS = re.compile(r"\b([A-Za-z_]\w*?)([123]d)((?:/[123]d)+)")


def _registry() -> dict[str, bool]:
    """Op name -> supported, for every name with one verdict (classes, functions, methods
    and handler names, with and without their 1d/2d/3d suffix)."""
    verdicts: dict[str, set[bool]] = {}
    entries = [*((cls.__name__, h) for cls, h in MODULES.items()),
               *((getattr(fn, "__name__", ""), h) for fn, h in FUNCTIONS.items()),
               *METHODS.items()]
    for name, handler in entries:
        ok = handler.family != "unsupported"
        for key in {name, handler.name, re.sub(r"[123]d$", "", name)}:
            if key and re.fullmatch(r"[A-Za-z_]\w*", key) and not key.startswith("__"):
                verdicts.setdefault(key, set()).add(ok)
    return {k: v.pop() for k, v in verdicts.items() if len(v) == 1 and k not in MODE_WORDS}


REGISTRY = _registry()


def _names(text: str) -> set[str]:
    """The op names a text mentions (``Conv1d/2d/3d`` read as Conv1d, Conv2d, Conv3d)."""
    text = _DIMS.sub(lambda m: " ".join(m.group(1) + d for d in
                                        [m.group(2), *m.group(3).split("/")[1:]]), text)
    words = (w.rstrip("-") for w in re.findall(r"[A-Za-z_][\w-]*", text))
    return {w for w in words if w in REGISTRY}  # squeeze-excitation is no squeeze


def _paragraphs(path: Path) -> list[tuple[str | None, str, int]]:
    """(mark, text, line) of every top-level paragraph and table of a page (code and
    list items left out)."""
    tokens = MarkdownIt().enable("table").parse(GENERATED.sub(
        lambda m: "\n" * m.group(0).count("\n"), path.read_text()))
    out, mark = [], None
    for i, token in enumerate(tokens):
        if token.type == "html_block":
            found = MARK.search(token.content)
            mark = found.group(1) if found else mark
            continue
        if token.type in ("paragraph_open", "table_open") and token.level == 0:
            close = "paragraph_close" if token.type == "paragraph_open" else "table_close"
            end = next(j for j in range(i, len(tokens)) if tokens[j].type == close)
            text = " ".join(t.content for t in tokens[i:end] if t.type == "inline")
            out.append((mark, text, token.map[0] + 1))
            mark = None
    return out


BLOCKS = [(path, *block) for path in PAGES for block in _paragraphs(path)]


def test_the_registry_is_read():
    assert REGISTRY["ReLU6"] and REGISTRY["interpolate"] and REGISTRY["Conv2d"]
    assert not REGISTRY["GELU"] and not REGISTRY["LayerNorm"] and not REGISTRY["softmax"]
    assert sum(mark is not None for _, mark, _, _ in BLOCKS) >= 4  # the marks are seen


@pytest.mark.parametrize(("path", "mark", "text", "line"),
                         [b for b in BLOCKS if b[1] is not None],
                         ids=[f"{b[0].name}:{b[3]}" for b in BLOCKS if b[1] is not None])
def test_every_marked_list_agrees_with_the_op_table(path, mark, text, line):
    names = _names(text)
    assert names, f"{path.name}:{line}: a marked list names no operation of the table"
    wrong = sorted(n for n in names if REGISTRY[n] != (mark == "supported"))
    assert not wrong, (f"{path.name}:{line}: listed as {mark} but the op table says "
                       f"otherwise: {wrong}")


def test_no_list_of_operations_is_left_unchecked():
    """A paragraph or table naming four module classes or more (the words a list of
    operations is made of; lower-case names such as size or log are also plain words)."""
    unmarked = [f"{path.name}:{line} {sorted(_names(text))}"
                for path, mark, text, line in BLOCKS
                if mark is None and len({n for n in _names(text) if n[0].isupper()}) >= 4]
    assert not unmarked, "mark these lists <!-- ops: supported/refused -->: " + \
        "; ".join(unmarked)


def _hook():
    spec = importlib.util.spec_from_file_location("ops_table", ROOT / "hooks" / "ops_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_networks_page_table_is_generated_from_the_registry():
    """docs/networks.md holds the marker the mkdocs hook (mkdocs.yml ``hooks``) replaces by
    the generated table, which names every supported handler (e.g. MaxPool2d, interpolate,
    'views and splits') and only supported operations."""
    hook = _hook()
    assert "hooks/ops_table.py" in (ROOT / "mkdocs.yml").read_text()
    page = (ROOT / "docs" / "networks.md").read_text()
    assert hook.MARKER in page.splitlines()
    table = supported_table()
    assert table in hook.expand(page) and hook.MARKER not in hook.expand(page)
    expanded = _DIMS.sub(lambda m: " ".join(m.group(1) + d for d in
                                            [m.group(2), *m.group(3).split("/")[1:]]), table)
    handlers = {h.name for h in (*MODULES.values(), *FUNCTIONS.values(), *METHODS.values())
                if h.family != "unsupported"}
    missing = sorted(name for name in handlers if name not in expanded)
    assert not missing, f"the generated table does not name {missing}"
    wrong = sorted(n for n in _names(table) if not REGISTRY[n])
    assert not wrong, f"the generated table names refused operations {wrong}"

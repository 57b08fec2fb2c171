"""The code blocks of README.md and docs/*.md, by page and section, for the tests that run them as written.

A section is the text from a heading to the next heading of any level. A test runs a section's
```sh blocks with `doc_commands(page, heading)` and its ```python blocks with `doc_python(page,
heading)`; tests/test_docs.py checks that every such block is in a section some test reads so.
Blocks that are not commands (output, file formats, a synopsis) are ```text, ```yaml and the like.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNNABLE = ("sh", "python")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>\S*)\s*$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    heading: str  # the section's heading line, e.g. "## Deploying to a device"
    lang: str
    text: str
    line: int  # where the block opens


def pages() -> list[str]:
    return ["README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]


def blocks(page: str) -> list[Block]:
    found, heading, fence, body = [], "", None, []
    for number, line in enumerate((REPO / page).read_text().splitlines(), 1):
        if fence is None:
            opening = FENCE.match(line)
            if opening:
                fence, body = (opening.group("indent"), opening.group("lang"), number), []
            elif line.startswith("#"):
                heading = line.strip()
        elif line.strip() == "```":
            indent, lang, start = fence
            found.append(Block(page, heading, lang, "\n".join(b[len(indent) :] for b in body) + "\n", start))
            fence = None
        else:
            body.append(line)
    assert fence is None, f"{page}:{fence[2]}: a code block is never closed"
    return found


def section_blocks(page: str, heading: str, lang: str) -> list[str]:
    found = [b.text for b in blocks(page) if b.heading == heading and b.lang == lang]
    assert found, f"{page} has no ```{lang} block under {heading!r}"
    return found


def doc_commands(page: str, heading: str) -> list[str]:
    """The command lines of the section's ```sh blocks, comments, continuations and blank lines folded away."""
    lines = []
    for text in section_blocks(page, heading, "sh"):
        lines += [re.sub(r"\s+#.*$", "", line).strip() for line in text.replace("\\\n", " ").splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def doc_python(page: str, heading: str) -> str:
    """The section's ```python blocks, as one program."""
    return "\n".join(section_blocks(page, heading, "python"))

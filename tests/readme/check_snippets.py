#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fails when a code block in the docs differs from the compiled test it quotes.

In a Markdown file, a line `<!-- snippet: tests/readme/tour.cpp#NAME -->` must be followed by a
fenced code block; in the named file, the lines between `// snippet-begin: NAME` and
`// snippet-end: NAME` (`#` instead of `//` in CMake and shell files) are the region. The block
must equal the region with its common indentation removed, so the docs cannot drift from code a
test compiles and runs.
Usage: check_snippets.py SOURCE_DIR FILE.md...
"""
import pathlib
import re
import sys
import textwrap

MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(\S+?)#(\S+)\s*-->\s*$")


def region(path: pathlib.Path, name: str) -> str:
    lines = path.read_text().splitlines()
    def marked(kind):
        return [i for i, l in enumerate(lines)
                if l.strip() in (f"// snippet-{kind}: {name}", f"# snippet-{kind}: {name}")]
    begin, end = marked("begin"), marked("end")
    if len(begin) != 1 or len(end) != 1 or end[0] <= begin[0]:
        raise ValueError(f"{path}: needs exactly one 'snippet-begin: {name}' line before one "
                         f"'snippet-end: {name}' line (after // or #)")
    return textwrap.dedent("\n".join(lines[begin[0] + 1:end[0]])).strip("\n")


def fenced_block_after(lines, start):
    i = start + 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines) or not lines[i].startswith("```"):
        return None
    body = []
    for line in lines[i + 1:]:
        if line.startswith("```"):
            return "\n".join(body).strip("\n")
        body.append(line)
    return None


def main() -> int:
    root = pathlib.Path(sys.argv[1]).resolve()
    failures, checked = 0, 0
    for md in sys.argv[2:]:
        md_path = pathlib.Path(md)
        lines = md_path.read_text().splitlines()
        for n, line in enumerate(lines):
            m = MARKER.match(line)
            if not m:
                continue
            where = f"{md_path.name}:{n + 1}"
            block = fenced_block_after(lines, n)
            if block is None:
                print(f"{where}: snippet marker for {m.group(1)}#{m.group(2)} is not followed by a "
                      "fenced code block")
                failures += 1
                continue
            try:
                want = region(root / m.group(1), m.group(2))
            except (OSError, ValueError) as e:
                print(f"{where}: {e}")
                failures += 1
                continue
            checked += 1
            if block != want:
                failures += 1
                print(f"{where}: the block differs from {m.group(1)}#{m.group(2)}; paste this:")
                print(want)
    if failures:
        print(f"{failures} snippet(s) out of date")
        return 1
    if checked == 0:
        print("no snippet markers found: nothing was checked")
        return 1
    print(f"{checked} snippet(s) match their sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())

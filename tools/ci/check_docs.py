#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fails when a current doc or a code comment names a repository path that does not exist.

What is checked:
  * every relative link in a Markdown file, `[text](target)` and `![alt](target)`, resolved
    against the file's folder; a `#fragment` into a Markdown file must name one of its headings
    (GitHub's anchors: lowercased, punctuation dropped, spaces to hyphens);
  * every repository path named in the text of the Markdown files and in the comments of the code
    (C++/CUDA `//` and `/* */`, `#` in shell and CMake, `#` and docstrings in Python);
  * a Markdown path followed by a quoted title, `docs/cuda.md "Pageable homes"` (a comma between
    them allowed), names one of that file's headings or the start of one (case and backticks
    aside).

Which files: every tracked `*.md` but those under docs/history/ (the log of experiments, which
cites results by commit); and the code under include/, examples/, tests/, bench/ and tools/.

What counts as a repository path: a run of path characters (letters, digits, `_ . - / * + ~`,
and `{a,b}` groups) that starts with a top-level folder and a slash (include/, examples/,
tests/, bench/, tools/, docs/, cmake/, configs/, python/, .ci/), or with `oomb/` (read as
include/oomb/ or python/src/oomb/) or `trainer/` (examples/trainer/); a path may also be relative
to the folder of the file that names it. A run that follows `$`, `/`, `.`, a
letter or a digit is part of something else (`$OUT/tests/...`, `build/bench/...`,
`393e411:bench/...`) and is not checked. The path ends at `#` or `:` (an anchor or a line number)
and at `...`; trailing dots are dropped; `{a,b}` expands to both; `*` must match something. A
placeholder such as `<commit>` ends the run, so what is checked is the part before it. A path
that ends in `-` or `_` is a file-name prefix and must begin some file's name. "Exists" means
tracked by git or present and not ignored, so a check here agrees with one on a clean clone.

Usage: check_docs.py [ROOT]   (default: the repository holding this script)
Prints one line per missing path (FILE:LINE: ...) and exits 1 if there is any.
"""
import fnmatch
import io
import os
import pathlib
import re
import subprocess
import sys
import tokenize

TOP = ("include/", "examples/", "tests/", "bench/", "tools/", "docs/", "cmake/", "configs/",
       "python/", ".ci/")
ALIASES = (("oomb/", ("include/oomb/", "python/src/oomb/")), ("trainer/", ("examples/trainer/",)))
CODE_ROOTS = ("include/", "examples/", "tests/", "bench/", "tools/")
C_LIKE = (".hpp", ".h", ".cpp", ".cc", ".cu", ".cuh")
HASH_COMMENT = (".sh", ".cmake")
EXEMPT = ("docs/history/",)

PATH_RUN = re.compile(r"(?:[A-Za-z0-9_.\-/*+~#:]|\{[^{}\s]*\})+")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
TITLED = re.compile(r'((?:[A-Za-z0-9_.\-]+/)*[A-Za-z0-9_.\-]+\.md),?\s+"([^"]+)"')
URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://\S+")


def repo_files(root):
    """Tracked files plus untracked ones git does not ignore; the folders that hold them."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], check=True, capture_output=True).stdout
        files = {f for f in out.decode().split("\0") if f and (root / f).exists()}
    except (OSError, subprocess.CalledProcessError):
        files = set()
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if not x.startswith(".") and not x.startswith("build")]
            for n in names:
                files.add(str(pathlib.Path(d, n).relative_to(root)))
    dirs = set()
    for f in files:
        p = pathlib.PurePosixPath(f).parent
        while str(p) != ".":
            dirs.add(str(p))
            p = p.parent
    return files, dirs


def expand_braces(s):
    m = re.search(r"\{([^{}]*)\}", s)
    if not m:
        return [s]
    return [x for alt in m.group(1).split(",") for x in expand_braces(s[:m.start()] + alt + s[m.end():])]


class Repo:
    def __init__(self, root):
        self.root = root
        self.files, self.dirs = repo_files(root)
        self.sorted_files = sorted(self.files)

    def exists(self, path):
        """path: relative to the root, POSIX, maybe with a trailing slash, `*` or a name prefix."""
        path = path.rstrip("/") if path.endswith("/") and path != "/" else path
        path = os.path.normpath(path).replace(os.sep, "/") if path else path
        if path in self.files or path in self.dirs:
            return True
        if any(c in path for c in "*?["):
            return any(fnmatch.fnmatchcase(f, path) or fnmatch.fnmatchcase(f, path + "/*")
                       for f in self.sorted_files) or any(fnmatch.fnmatchcase(d, path) for d in self.dirs)
        return False

    def prefix_exists(self, path):
        return any(f.startswith(path) for f in self.sorted_files)


def candidate_paths(text):
    """(column, raw, path) for every repository path named in a piece of prose or comment."""
    text = URL.sub(lambda m: " " * len(m.group(0)), text)
    for m in PATH_RUN.finditer(text):
        raw = m.group(0)
        before = text[m.start() - 1] if m.start() > 0 else " "
        if before.isalnum() or before in "$/.\\_-":
            continue
        path = raw
        for stop in ("...", "#", ":"):
            cut = path.find(stop)
            if cut >= 0:
                path = path[:cut]
        path = path.rstrip(".")
        alias = next((real for name, real in ALIASES if path.startswith(name)), None)
        if alias:
            rest = path[path.index("/") + 1:]
            yield m.start(), raw, tuple(base + rest for base in alias) + (path,)
        elif path.startswith(TOP) and "/" in path:
            yield m.start(), raw, (path,)


def heading_titles(md_text):
    titles, fence = set(), False
    for line in md_text.splitlines():
        if line.startswith("```"):
            fence = not fence
            continue
        m = None if fence else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            titles.add(m.group(1).replace("`", "").strip().lower())
    return titles


def heading_anchors(md_text):
    anchors, seen, fence = set(), {}, False
    for line in md_text.splitlines():
        if line.startswith("```"):
            fence = not fence
            continue
        m = None if fence else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


# ---- comments of code files, as (line number, text) ----

def c_comments(src):
    out, i, n, line = [], 0, len(src), 1
    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append((line, src[i + 2:j]))
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j
            for k, part in enumerate(src[i + 2:j].split("\n")):
                out.append((line + k, part))
            line += src.count("\n", i, j)
            i = j + 2
        elif c == "R" and src.startswith('R"', i) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'R"([^()\\\s]{0,16})\(', src[i:])
            if not m:
                i += 1
                continue
            end = src.find(")" + m.group(1) + '"', i)
            end = n if end < 0 else end
            line += src.count("\n", i, end)
            i = end + len(m.group(1)) + 2
        elif c in "\"'":
            if c == "'" and i > 0 and (src[i - 1].isalnum()):  # a digit separator: 1'000
                i += 1
                continue
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return out


def hash_comments(src):
    out = []
    for number, text in enumerate(src.splitlines(), 1):
        quote = None
        for k, c in enumerate(text):
            if quote:
                if c == "\\" and quote == '"':
                    continue
                if c == quote:
                    quote = None
            elif c in "\"'":
                quote = c
            elif c == "#" and (k == 0 or text[k - 1] in " \t;("):
                out.append((number, text[k + 1:]))
                break
    return out


def python_comments(src):
    out = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(src).readline))
    except (tokenize.TokenError, SyntaxError):
        return hash_comments(src)
    previous = tokenize.NEWLINE
    for t in tokens:
        if t.type == tokenize.COMMENT:
            out.append((t.start[0], t.string[1:]))
        elif t.type == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                                                        tokenize.NL, tokenize.ENCODING):
            for k, part in enumerate(t.string.split("\n")):
                out.append((t.start[0] + k, part))
        if t.type not in (tokenize.COMMENT, tokenize.NL):
            previous = t.type
    return out


def code_comments(path, src):
    name = path.name
    if path.suffix in C_LIKE:
        return c_comments(src)
    if path.suffix == ".py":
        return python_comments(src)
    if path.suffix in HASH_COMMENT or name == "CMakeLists.txt":
        return hash_comments(src)
    return []


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
    repo = Repo(root.resolve())
    problems, counts = [], {"docs": 0, "code": 0, "paths": 0, "links": 0}

    missing = []  # (where, raw, the first reading), checked against .gitignore at the end

    titles_of = {}

    def check_title(where, text, base=None):
        """`FILE.md "Title"` in prose or a comment: the file must have a heading of that title."""
        for m in TITLED.finditer(text):
            name, title = m.group(1), m.group(2)
            options = [name] + ([os.path.normpath(str(base / name))] if base is not None else [])
            target = next((o for o in options if o in repo.files), None)
            if target is None:
                continue  # the path check reports a missing file
            if target not in titles_of:
                titles_of[target] = heading_titles((repo.root / target).read_text(encoding="utf-8"))
            wanted = title.replace("`", "").strip().lower()
            if not any(t == wanted or t.startswith(wanted) for t in titles_of[target]):
                problems.append(f"{where}: {target} has no heading \"{title}\"")

    def check_path(where, raw, readings, base):
        """readings: the paths the name may stand for (an alias has several, and each may also be
        relative to the naming file's folder `base`); one must exist."""
        counts["paths"] += 1
        if str(base) not in ("", "."):
            readings = tuple(readings) + tuple(os.path.normpath(str(base / r)) for r in readings)
        for alternatives in zip(*(expand_braces(r) for r in readings)):
            if not any(repo.exists(p) or (p.endswith(("-", "_")) and repo.prefix_exists(p))
                       for p in alternatives):
                missing.append((where, raw, alternatives[0]))

    md_files = sorted(f for f in repo.files if f.endswith(".md") and not f.startswith(EXEMPT))
    anchors_of = {}
    for rel in md_files:
        counts["docs"] += 1
        text = (repo.root / rel).read_text(encoding="utf-8")
        base = pathlib.PurePosixPath(rel).parent
        for number, line in enumerate(text.splitlines(), 1):
            where = f"{rel}:{number}"
            for m in LINK.finditer(line):
                target = m.group(1)
                if re.match(r"^[A-Za-z][A-Za-z0-9+.\-]*:", target):
                    continue  # a URL or mailto:
                counts["links"] += 1
                file_part, _, fragment = target.partition("#")
                resolved = os.path.normpath(str(base / file_part)) if file_part else rel
                resolved = resolved.replace(os.sep, "/")
                if resolved.startswith("../") or not repo.exists(resolved):
                    problems.append(f"{where}: link to a file that is not in the repository: {target}")
                    continue
                if fragment and resolved.endswith(".md"):
                    if resolved not in anchors_of:
                        anchors_of[resolved] = heading_anchors((repo.root / resolved).read_text(encoding="utf-8"))
                    if fragment not in anchors_of[resolved]:
                        problems.append(f"{where}: link to a heading {resolved} does not have: {target}")
            for _, raw, path in candidate_paths(LINK.sub(" ", line)):
                check_path(where, raw, path, base)
            check_title(where, line, base)

    for rel in sorted(repo.files):
        if not rel.startswith(CODE_ROOTS):
            continue
        path = repo.root / rel
        kind = pathlib.PurePosixPath(rel)
        if kind.suffix not in C_LIKE + HASH_COMMENT + (".py",) and kind.name != "CMakeLists.txt":
            continue
        try:
            src = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        counts["code"] += 1
        for number, comment in code_comments(kind, src):
            for _, raw, p in candidate_paths(comment):
                check_path(f"{rel}:{number}", raw, p, kind.parent)
            check_title(f"{rel}:{number}", comment)

    # A path git ignores is a build output (build*/, .venv, runs/): named, never committed. Each is
    # asked as a folder too, since a folder pattern (build*/) matches no path that is not there yet.
    ignored = set()
    if missing:
        names = sorted({p for _, _, p in missing} | {p.rstrip("/") + "/" for _, _, p in missing})
        try:
            out = subprocess.run(["git", "-C", str(repo.root), "check-ignore", "--no-index", "--stdin", "-z"],
                                 input="\0".join(names).encode(), capture_output=True).stdout
            ignored = {x for x in out.decode().split("\0") if x}
        except OSError:
            pass
    for where, raw, p in missing:
        if p in ignored or p.rstrip("/") + "/" in ignored:
            continue
        shown = raw if raw == p else f"{raw} (as {p})"
        problems.append(f"{where}: no such path in the repository: {shown}")
    for p in sorted(problems, key=lambda x: (x.split(":")[0], int(x.split(":")[1]))):
        print(p)
    print(f"check_docs: {counts['docs']} Markdown files, {counts['code']} code files, "
          f"{counts['links']} relative links, {counts['paths']} repository paths; "
          f"{len(problems)} missing")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Checks that the repository's documentation stands alone.

  1. No tracked file cites a design or research note that lives outside the repository (the
     former design contracts, now docs/semantics.md, docs/events.md, docs/architecture.md and
     docs/style.md): such a reference sends a reader to a file they do not have.
  2. Every relative link in a tracked Markdown file, `[text](path)` or `[text](path#anchor)`,
     names a file or folder that exists, and its anchor (if any) a heading of that Markdown
     file, slugged as GitHub does.

    tests/docs/check_docs.py [REPO_ROOT]     (default: the repository holding this script)

Prints one line per problem (`file:line: what`) and exits 1 when there is any, else 0.
"""
import os
import re
import subprocess
import sys

# Written in pieces so that this file does not match its own patterns.
_OUTSIDE_NAMES = ("SEMANTICS", "EVENTS", "ARCHITECTURE", "STYLE")
OUTSIDE_REFERENCE = re.compile(
    r"\b(?:" + "|".join(_OUTSIDE_NAMES) + r")\.md\b"
    r"|shared/(?:design|research)\b"
    r"|(?<![\w/.-])research/[\w.-]+\.md\b")

# Where the notes went, for the message.
REPLACEMENTS = {
    "SEMANTICS": "docs/semantics.md", "EVENTS": "docs/events.md",
    "ARCHITECTURE": "docs/architecture.md", "STYLE": "docs/style.md",
}

LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`+[^`]*`+")


def tracked_files(root):
    """Files git tracks under root; without git, every file outside build and VCS folders."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True,
                             capture_output=True).stdout
        return sorted(p for p in out.decode("utf-8", "replace").split("\0") if p)
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if not x.startswith((".", "build"))]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
        return sorted(files)


def read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (UnicodeDecodeError, OSError):
        return None  # binary or unreadable: not documentation


def slug(heading):
    """GitHub's anchor of a heading: markup dropped, lowercase, punctuation removed, spaces to
    hyphens ("3. Agent ↔ master" -> "3-agent--master")."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = re.sub(r"[*_]{1,3}([^*_]+)[*_]{1,3}", r"\1", text)
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def markdown_lines(text):
    """(line number, line) of the lines outside fenced code blocks."""
    in_fence = False
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            yield n, line


def anchors(text):
    seen = {}
    out = set()
    for _, line in markdown_lines(text):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    for m in re.finditer(r"<a\s+(?:name|id)=\"([^\"]+)\"", text):
        out.add(m.group(1))
    return out


def check_outside_references(root, files):
    problems = []
    for rel in files:
        text = read_text(os.path.join(root, rel))
        if text is None:
            continue
        for n, line in enumerate(text.split("\n"), 1):
            for m in OUTSIDE_REFERENCE.finditer(line):
                name = m.group(0).split(".")[0]
                where = REPLACEMENTS.get(name, "the matching file in docs/")
                problems.append(f"{rel}:{n}: cites '{m.group(0)}', which is not in this "
                                f"repository; point to {where} (and its section) instead")
    return problems


def check_links(root, files):
    problems = []
    tracked = set(files)
    anchor_cache = {}

    def anchors_of(rel):
        if rel not in anchor_cache:
            anchor_cache[rel] = anchors(read_text(os.path.join(root, rel)) or "")
        return anchor_cache[rel]

    for rel in files:
        if not rel.endswith(".md"):
            continue
        text = read_text(os.path.join(root, rel))
        if text is None:
            continue
        base = os.path.dirname(rel)
        for n, line in markdown_lines(text):
            line = INLINE_CODE.sub("", line)
            for m in list(LINK.finditer(line)) + list(IMAGE.finditer(line)):
                target = m.group(1).strip("<>")
                if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
                    continue  # http:, https:, mailto: ...: not ours to check offline
                path, _, anchor = target.partition("#")
                if path.startswith("/"):
                    problems.append(f"{rel}:{n}: link '{target}' is absolute; use a path "
                                    f"relative to {rel}")
                    continue
                dest = os.path.normpath(os.path.join(base, path)) if path else rel
                if dest.startswith(".."):
                    problems.append(f"{rel}:{n}: link '{target}' leaves the repository")
                    continue
                full = os.path.join(root, dest)
                if not os.path.exists(full):
                    problems.append(f"{rel}:{n}: link '{target}': {dest} does not exist")
                    continue
                if dest not in tracked and os.path.isfile(full) and files is not None:
                    problems.append(f"{rel}:{n}: link '{target}': {dest} is not tracked")
                    continue
                if anchor and dest.endswith(".md") and anchor not in anchors_of(dest):
                    problems.append(f"{rel}:{n}: link '{target}': {dest} has no heading "
                                    f"with anchor #{anchor}")
    return problems


def check(root):
    files = tracked_files(root)
    return check_outside_references(root, files) + check_links(root, files)


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_docs: {len(problems)} problem(s) in {root}", file=sys.stderr)
        return 1
    print(f"check_docs: every reference stays in {root} and every Markdown link resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Checks that the repository cites only documents it contains.

Two rules, over every tracked text file (`git ls-files`; a tree walk without build/ and .git/ when
git is unavailable):

1. No file names a path outside the repository that the docs used to cite: the lead's shared
   folder (the /work prefix followed by "shared", or its design notes, "shared/" + DESIGN.md) or
   the out-of-tree reference files (a "specs/" path ending in vestigekv.md, geodesia-kv.md,
   kimi-linear.md or testbed-recipe.md). What the code relies on from those sources lives in
   docs/reference/ (and docs/testbed.md for the testbed recipe).
2. Every section citation resolves. A citation is a `§N` or `§N.M...` token; it refers to the
   docs/reference/X.md named most recently before it in the same file, or, before any name, to
   the first one the file names (so a header comment can cite on its first line and name the
   document on the next); in a docs/reference/ file itself, to that file until another is named.
   A file with a `§` citation and no docs/reference/ name is an error, and so is a name of a
   docs/reference/ file that does not exist. A section exists when the document has an anchor for
   it: a heading `#... §N.M title` or a list item starting `- **§N.M**`.

Usage: check_doc_refs.py [ROOT]          (ROOT defaults to the repository root)
       check_doc_refs.py --self-test     (runs the checker on generated trees; exit 0 if it works)
Prints one line per problem (file:line: what) and exits 1 if there is any.
"""

import os
import re
import subprocess
import sys
import tempfile

# Spelled in pieces so that this file does not match its own rule.
FORBIDDEN = [
    "/work/" + "shared",
    "specs/" + "vestigekv.md",
    "specs/" + "geodesia-kv.md",
    "specs/" + "kimi-linear.md",
    "specs/" + "testbed-recipe.md",
    "shared/" + "DESIGN.md",
]
REF_DIR = "docs/reference/"
SELF = "scripts/check_doc_refs.py"
REF_NAME = re.compile(r"docs/reference/([A-Za-z0-9_.-]+\.md)")
CITATION = re.compile("\u00a7" + r"(\d+(?:\.\d+)*)")
ANCHOR = re.compile(r"^(?:#+ +|- +\*\*)" + "\u00a7" + r"(\d+(?:\.\d+)*)\b")


def tracked_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True,
                             capture_output=True).stdout
        return sorted(p for p in out.decode("utf-8", "replace").split("\0") if p)
    except (OSError, subprocess.CalledProcessError):
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in (".git", "build")]
            for f in filenames:
                files.append(os.path.relpath(os.path.join(dirpath, f), root))
        return sorted(files)


def read_text(path):
    """The file's text, or None for a binary file (a NUL byte) or one that cannot be read."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"\0" in data:
        return None
    return data.decode("utf-8", "replace")


def anchors_of(text):
    found = set()
    for line in text.splitlines():
        m = ANCHOR.match(line)
        if m:
            found.add(m.group(1))
    return found


def check(root):
    problems = []
    files = tracked_files(root)
    anchors = {}  # reference doc name -> its section anchors (None: the file is missing)

    def sections(name):
        if name not in anchors:
            text = read_text(os.path.join(root, REF_DIR, name))
            anchors[name] = None if text is None else anchors_of(text)
        return anchors[name]

    for rel in files:
        if rel == SELF:
            continue  # its docstring and self-test name example documents on purpose
        text = read_text(os.path.join(root, rel))
        if text is None:
            continue
        current = rel[len(REF_DIR):] if rel.startswith(REF_DIR) and rel.endswith(".md") else None
        if current is None:
            first = REF_NAME.search(text)
            current = first.group(1) if first else None
        for lineno, line in enumerate(text.splitlines(), 1):
            for bad in FORBIDDEN:
                if bad in line:
                    problems.append(f"{rel}:{lineno}: names '{bad}', which is not in the "
                                    f"repository (cite docs/reference/ instead)")
            # Walk the line left to right: a reference name switches the current document, a
            # citation is checked against the current one.
            events = [(m.start(), "ref", m.group(1)) for m in REF_NAME.finditer(line)]
            events += [(m.start(), "cite", m.group(1)) for m in CITATION.finditer(line)]
            for _, kind, value in sorted(events):
                if kind == "ref":
                    current = value
                    if sections(value) is None:
                        problems.append(f"{rel}:{lineno}: cites {REF_DIR}{value}, which does "
                                        f"not exist")
                    continue
                if current is None:
                    problems.append(f"{rel}:{lineno}: \u00a7{value} names no document (no "
                                    f"{REF_DIR}X.md before it in this file)")
                    continue
                found = sections(current)
                if found is not None and value not in found:
                    problems.append(f"{rel}:{lineno}: \u00a7{value} is not a section of "
                                    f"{REF_DIR}{current}")
    return problems


def self_test():
    def tree(files):
        d = tempfile.mkdtemp(prefix="check_doc_refs_")
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(d, rel)) or d, exist_ok=True)
            with open(os.path.join(d, rel), "w", encoding="utf-8") as f:
                f.write(text)
        return d

    s = "\u00a7"
    ref = (f"# Ref\n\n## {s}1 Layout\n\n### {s}1.3 Tiers\n\ntext {s}1.3 cites itself\n\n"
           f"## {s}12 Checks\n\n- **{s}12.13** GQA.\n")
    cases = [
        # (files, expected number of problems, what it shows)
        ({"docs/reference/a.md": ref,
          "kv/x.h": f"// Reference: docs/reference/a.md. See {s}1.3 and {s}12.13, {s}12.\n"},
         0, "valid citations through a file-header name"),
        ({"docs/reference/a.md": ref, "kv/x.h": f"// docs/reference/a.md {s}2.4\n"},
         1, "a section the document lacks"),
        ({"docs/reference/a.md": ref, "kv/x.h": f"// spec {s}1.3\n"},
         1, "a citation that names no document"),
        ({"docs/reference/a.md": ref, "kv/x.h": f"// Header ({s}1.3).\n// Cites docs/reference/a.md.\n"},
         0, "a citation before the file's first document name"),
        ({"docs/reference/a.md": ref, "kv/x.h": f"// Header ({s}2).\n// Cites docs/reference/a.md.\n"},
         1, "the same, with a section the document lacks"),
        ({"kv/x.h": f"// docs/reference/missing.md {s}1\n"},
         1, "a reference document that does not exist"),
        ({"docs/reference/a.md": ref, "docs/x.md": "see " + FORBIDDEN[1] + "\n"},
         1, "an out-of-tree spec path"),
        ({"README.md": "notes in " + FORBIDDEN[0] + "/notes.md\n"},
         1, "the shared folder"),
        ({"docs/reference/a.md": ref, "docs/reference/b.md": f"## {s}9 Eval\n",
          "x.md": f"docs/reference/b.md {s}9, docs/reference/a.md {s}1.3; {s}9\n"},
         1, "the most recent document wins ({s}9 after a.md)"),
    ]
    ok = True
    for files, want, what in cases:
        # Not a git repository: the checker walks the tree.
        got = check(tree(files))
        if len(got) != want:
            ok = False
            print(f"self-test FAILED ({what}): expected {want} problem(s), got {got}")
    print("self-test", "passed" if ok else "FAILED")
    return 0 if ok else 1


def main(argv):
    if len(argv) > 1 and argv[1] == "--self-test":
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} problem(s): cite only documents in the repository "
              f"({REF_DIR} holds the reference descriptions)")
        return 1
    print("check_doc_refs: every citation resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

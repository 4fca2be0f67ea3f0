#!/usr/bin/env python3
"""Regenerates the policy settings tables in README.md and docs/*.md from `strata policies`.

Each table sits between `<!-- BEGIN generated: strata ARGS -->` and `<!-- END generated -->`;
the text between them is replaced by the output of `STRATA ARGS`. cli/cli_test.cc
(PolicyTablesInDocsMatchTheDeclarations) fails when a table differs from the declarations.
Usage: python3 scripts/update-policy-tables.py build/release/strata
"""
import pathlib
import re
import subprocess
import sys

FILES = ["README.md", "docs/vestige.md", "docs/geodesia.md", "docs/baselines.md"]
BLOCK = re.compile(r"(<!-- BEGIN generated: strata (.*?) -->\n)(.*?)(<!-- END generated -->)",
                   re.S)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    strata = sys.argv[1]
    root = pathlib.Path(__file__).resolve().parent.parent
    for name in FILES:
        path = root / name
        text = path.read_text()

        def regenerate(m):
            out = subprocess.run([strata] + m.group(2).split(), capture_output=True, text=True,
                                 check=True).stdout
            return m.group(1) + out + m.group(4)

        new = BLOCK.sub(regenerate, text)
        if new != text:
            path.write_text(new)
            print("updated", name)


if __name__ == "__main__":
    main()

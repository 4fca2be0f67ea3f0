#!/usr/bin/env python3
"""Regenerates docs/cli.md, the flag reference of every `strata` command, from the binary's help.

Each command's `--help` is parsed (CLI11's layout: an option line "  -m,--model TEXT=DEFAULT  help",
help text continued on indented lines) into a table of flag, default and help. The test
TruthTest.DocsAndHelpNameTheSameFlags (cli/truth_test.cc) fails when a command's flags and its
section here differ, so run this after adding, renaming or removing a flag:

  python3 scripts/update-cli-doc.py build/release/strata

A default that is the machine's thread count is written as "hardware threads", so the file does
not depend on where it was generated.
"""

import os
import re
import subprocess
import sys

COMMANDS = [
    ["demo"], ["inspect"], ["generate"], ["synth"], ["convert"], ["logits"], ["quantize"], ["policies"], ["serve"],
    ["tokenize"], ["chat"],
    ["eval", "needle"], ["eval", "ppl"], ["eval", "kl"], ["eval", "ruler"],
    ["bench", "decode"], ["bench", "capacity"], ["bench", "attention"], ["bench", "serve"], ["bench", "prefill"],
]
# An option's head (names, type, default, flags) once its help text is split off; a default may
# hold spaces ("3.4 (geodesia); 16 (cquest)").
OPTION_RE = re.compile(r"^  (-[\w-]+(?:,--?[\w-]+)*)(?: ([A-Z]+)(?:=(\S.*?))?((?: REQUIRED| \.\.\.)*))?$")
POSITIONAL_RE = re.compile(r"^  (\w[\w-]*) ([A-Z]+(?: REQUIRED| \.\.\.)*)$")
HELP_COLUMN_RE = re.compile(r"^  -h,--help +(?=Print)")


def split_head(line, column, next_line):
    """(head, help) of an option or positional line. CLI11 pads the head to `column` (that of
    -h,--help's help) and starts the help there, its further lines (a help with newlines)
    indented to the column; a head too long for the column ends its line, and all of its help
    follows on the indented lines. A head may fill the column but for one space, and a default
    may hold single spaces, so the split is by position, not by a run of spaces: a line whose
    next line is indented is split only where two spaces of padding show it (a head holds no
    two spaces in a row)."""
    continued = next_line is not None and next_line.startswith(" " * column) and \
        next_line.strip() != ""
    padded = line[column - 2:column] == "  " if continued else line[column - 1:column] == " "
    if len(line) > column > 0 and padded and line[column] != " ":
        return line[:column].rstrip(), line[column:]
    return line.rstrip(), ""


def parse_help(text):
    """[(names, type, default, help)] from one command's help; positionals have no dash."""
    rows, section = [], None
    lines = text.splitlines()
    column = 0  # where CLI11 starts the help texts: that of -h,--help
    for line in lines:
        m = HELP_COLUMN_RE.match(line)
        if m:
            column = m.end()
            break
    for i, line in enumerate(lines):
        if line.endswith(":") and not line.startswith(" "):
            section = line[:-1]
            continue
        if section not in ("Options", "Positionals"):
            continue
        if line.startswith("    ") or not line.strip():
            if rows and line.strip():
                rows[-1][3] = (rows[-1][3] + " " + line.strip()).strip()
            continue
        head, help_text = split_head(line, column, lines[i + 1] if i + 1 < len(lines) else None)
        m = OPTION_RE.match(head) if section == "Options" else POSITIONAL_RE.match(head)
        if m and section == "Options":
            rows.append([m.group(1), ((m.group(2) or "") + (m.group(4) or "")).strip(),
                         m.group(3) or "", help_text.strip()])
        elif m:
            rows.append([m.group(1), m.group(2), "", help_text.strip()])
    return rows


def cell(s):
    return s.replace("|", "\\|")


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    strata = argv[1]
    cores = str(os.cpu_count() or 1)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = [
        "# `strata` command-line reference",
        "",
        "Every command's flags with their defaults, generated from the binary's `--help` by",
        "`python3 scripts/update-cli-doc.py build/release/strata`; `cli/truth_test.cc` checks that",
        "each command's flags are the ones listed here. `strata --version` prints the version.",
        "Exit codes: 0 success, 2 a bad flag, input file or request (the message names it), 1 a run",
        "that failed or measured nothing (e.g. `eval needle` with every trial dropped).",
        "",
        "Cache-policy settings are given as `--policy NAME:key=value:key=value` (`strata policies`",
        "lists them); the settings several policies share also have the `--KEY` shorthands below,",
        "whose default is each policy's own.",
    ]
    for cmd in COMMANDS:
        r = subprocess.run([strata] + cmd + ["--help"], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{' '.join(cmd)} --help failed: {r.stderr}", file=sys.stderr)
            return 1
        lines = r.stdout.splitlines()
        out += ["", f"## `strata {' '.join(cmd)}`", "", lines[0] if lines else "", ""]
        out += ["| flag | type | default | help |", "|---|---|---|---|"]
        for names, typ, default, help_text in parse_help(r.stdout):
            if names == "-h,--help":
                continue
            flag_names = names.split(",")
            if default == cores and "--threads" in flag_names:
                default = "hardware threads"
            if default == "1," + cores and "--threads" in flag_names:
                default = "1,hardware threads"
            shown = ", ".join(f"`{n}`" for n in flag_names)
            out.append(f"| {shown} | {typ} | {cell(default)} | {cell(help_text)} |")
    path = os.path.join(root, "docs", "cli.md")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

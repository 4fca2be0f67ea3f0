#!/usr/bin/env python3
"""Checks the `#include "..."` lines of the C++ tree against the module rules below.

A file in module M (its top-level folder) may include, by quoted path, headers of M itself and of
the modules M may depend on:

  core: std only          kernels: core          kv: core, kernels          io: core
  model: core, kernels, kv, io                   eval: core, kernels, kv, io, model
  serve: core, kernels, kv, io, model            cli: all

Test files (*_test.cc) follow the same table as their module (so a kv test cannot reach into
model/); test helpers (headers that include gtest, such as kv/baselines/test_util.h) may be
included by test files and other test helpers only, never by library code. Quoted includes whose
first path component is not a module (hwy/..., third-party headers) are outside these rules.

Usage: check_includes.py [ROOT]          (ROOT defaults to the repository root)
       check_includes.py --self-test     (runs the checker on generated trees; exit 0 if it works)
Prints one line per violation (file:line: includes "x": rule) and exits 1 if there is any.
"""

import os
import re
import sys
import tempfile

MODULE_DEPS = {
    "core": set(),
    "kernels": {"core"},
    "kv": {"core", "kernels"},
    "io": {"core"},
    "model": {"core", "kernels", "kv", "io"},
    "eval": {"core", "kernels", "kv", "io", "model"},
    "serve": {"core", "kernels", "kv", "io", "model"},
    "cli": {"core", "kernels", "kv", "io", "model", "eval", "serve"},
    "fuzz": {"core", "kernels", "kv", "io", "model", "serve"},
}
SOURCE_EXTS = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".inl")
SKIP_DIRS = {"build", ".git", "models", "third_party"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
GTEST_RE = re.compile(r'^\s*#\s*include\s*[<"](gtest|gmock)/')


def module_of(rel_path):
    top = rel_path.split("/", 1)[0]
    return top if top in MODULE_DEPS else None


def is_test_file(rel_path):
    return os.path.basename(rel_path).endswith("_test.cc")


def source_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
        for name in sorted(filenames):
            if name.endswith(SOURCE_EXTS):
                rel = os.path.normpath(os.path.join(rel_dir, name)).replace(os.sep, "/")
                if module_of(rel):
                    yield rel
        dirnames.sort()


def read_lines(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        return f.read().splitlines()


def check(root):
    """Returns the violations as printable lines, sorted by file and line."""
    files = list(source_files(root))
    # Test helpers: non-test headers that pull in gtest.
    helpers = set()
    for rel in files:
        if not is_test_file(rel) and rel.endswith((".h", ".hpp")):
            if any(GTEST_RE.match(line) for line in read_lines(root, rel)):
                helpers.add(rel)
    problems = []
    for rel in files:
        mod = module_of(rel)
        allowed = MODULE_DEPS[mod] | {mod}
        test_side = is_test_file(rel) or rel in helpers
        kind = "test" if is_test_file(rel) else ("test helper" if rel in helpers else "file")
        for lineno, line in enumerate(read_lines(root, rel), 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            inc = m.group(1)
            target = module_of(inc)
            if target is None:
                continue  # third-party (hwy/...) or a path outside the module tree
            if target not in allowed:
                may = ", ".join(sorted(MODULE_DEPS[mod])) or "std only"
                problems.append(f'{rel}:{lineno}: includes "{inc}": {kind} of module {mod} may '
                                f'include {mod} and {may}, not {target} (MODULE_DEPS)')
            elif inc in helpers and not test_side:
                problems.append(f'{rel}:{lineno}: includes "{inc}": a test helper (it includes '
                                f'gtest) may be included by tests only')
    return problems


def self_test():
    """The checker on generated trees: a clean one passes, each kind of violation is found."""
    cases = [
        # (files {path: text}, expected substrings of the violations; empty: must pass)
        ({"core/a.h": '#include <vector>\n#include "core/b.h"\n', "core/b.h": "",
          "kernels/k.cc": '#include "core/a.h"\n#include "hwy/highway.h"\n',
          "kv/p.cc": '#include "kernels/k.h"\n', "kv/p_test.cc": '#include "kv/util.h"\n',
          "kv/util.h": '#include <gtest/gtest.h>\n', "cli/m.cc": '#include "eval/e.h"\n'}, []),
        ({"kv/x_test.cc": '#include "model/model.h"\n'},
         ['kv/x_test.cc:1: includes "model/model.h": test of module kv']),
        ({"core/a.cc": '\n  #  include "kernels/ops.h"\n'},
         ['core/a.cc:2: includes "kernels/ops.h": file of module core may include core and '
          'std only, not kernels']),
        ({"kernels/a.cc": '#include "kv/store.h"\n', "io/b.cc": '#include "model/m.h"\n'},
         ['kernels/a.cc:1: includes "kv/store.h"', 'io/b.cc:1: includes "model/m.h"']),
        ({"kv/t.h": '#include "gtest/gtest.h"\n', "kv/lib.cc": '#include "kv/t.h"\n'},
         ['kv/lib.cc:1: includes "kv/t.h": a test helper']),
    ]
    ok = True
    for files, expected in cases:
        with tempfile.TemporaryDirectory() as root:
            for rel, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
                with open(os.path.join(root, rel), "w") as f:
                    f.write(text)
            got = check(root)
            if len(got) != len(expected) or any(
                    not any(e in g for g in got) for e in expected):
                ok = False
                print(f"self-test FAILED for {sorted(files)}:\n  expected {expected}\n  got {got}")
    print("check_includes self-test: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


def main(argv):
    if len(argv) > 1 and argv[1] == "--self-test":
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    root = os.path.abspath(root)
    problems = check(root)
    for p in problems:
        print(p)
    n_files = sum(1 for _ in source_files(root))
    if problems:
        print(f"check_includes: {len(problems)} violation(s) of the module rules "
              f"in {n_files} files")
        return 1
    print(f"check_includes: {n_files} files follow the module rules")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

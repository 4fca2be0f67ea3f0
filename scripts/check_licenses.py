#!/usr/bin/env python3
"""Checks that no GPL-only library is linked into the Strata binaries (Strata is Apache-2.0).

Lists every shared library a binary loads (`ldd`, so indirect ones such as OpenBLAS's Fortran
runtime count) and classifies each by its soname against LIBRARIES below. A library that is not in
the list fails the check until someone looks up its licence and adds it (with NOTICE updated if it
is a new dependency); a library whose licence is GPL without a linking exception fails always.
The GCC runtime (libstdc++, libgcc_s, libgfortran, libgomp) is GPL-3.0 with the GCC Runtime
Library Exception, which permits linking it into programs under any licence; glibc and libquadmath
are LGPL.

Usage: check_licenses.py BINARY...     prints one line per library, exits 1 on a violation
       check_licenses.py --self-test    runs the classifier on made-up ldd output; exit 0 if right
"""

import re
import subprocess
import sys

# soname prefix (up to ".so") -> (project, SPDX licence, allowed)
LIBRARIES = {
    "linux-vdso": ("Linux kernel vDSO", "none (kernel interface)", True),
    "ld-linux-x86-64": ("GNU C Library", "LGPL-2.1-or-later", True),
    "ld-linux-aarch64": ("GNU C Library", "LGPL-2.1-or-later", True),
    "libc": ("GNU C Library", "LGPL-2.1-or-later", True),
    "libm": ("GNU C Library", "LGPL-2.1-or-later", True),
    "libpthread": ("GNU C Library", "LGPL-2.1-or-later", True),
    "libdl": ("GNU C Library", "LGPL-2.1-or-later", True),
    "librt": ("GNU C Library", "LGPL-2.1-or-later", True),
    "libstdc++": ("GCC runtime", "GPL-3.0-or-later WITH GCC-exception-3.1", True),
    "libgcc_s": ("GCC runtime", "GPL-3.0-or-later WITH GCC-exception-3.1", True),
    "libgfortran": ("GCC runtime", "GPL-3.0-or-later WITH GCC-exception-3.1", True),
    "libgomp": ("GCC runtime", "GPL-3.0-or-later WITH GCC-exception-3.1", True),
    "libquadmath": ("GCC libquadmath", "LGPL-2.1-or-later", True),
    # The sanitizer runtimes of the asan preset (not in release builds): GCC's libsanitizer,
    # imported from LLVM compiler-rt.
    "libasan": ("GCC libsanitizer (asan builds only)", "NCSA OR MIT", True),
    "libubsan": ("GCC libsanitizer (asan builds only)", "NCSA OR MIT", True),
    "libhwy": ("Highway", "Apache-2.0 OR BSD-3-Clause", True),
    "libkissfft-float": ("KissFFT", "BSD-3-Clause", True),
    "libkissfft-double": ("KissFFT", "BSD-3-Clause", True),
    "libopenblas": ("OpenBLAS", "BSD-3-Clause", True),
    "libopenblasp": ("OpenBLAS", "BSD-3-Clause", True),
    "libblas": ("BLAS (reference or OpenBLAS)", "BSD-3-Clause", True),
    "liblapack": ("LAPACK", "BSD-3-Clause", True),
    "libgtest": ("GoogleTest (test binaries only)", "BSD-3-Clause", True),
    "libgtest_main": ("GoogleTest (test binaries only)", "BSD-3-Clause", True),
    # cpp-httplib (the server, serve/) as Debian builds it, with the libraries it links: OpenSSL
    # 3 (TLS support compiled in; the server speaks plain HTTP), zlib and Brotli (compression).
    "libcpp-httplib": ("cpp-httplib", "MIT", True),
    "libssl": ("OpenSSL 3 (via cpp-httplib)", "Apache-2.0", True),
    "libcrypto": ("OpenSSL 3 (via cpp-httplib)", "Apache-2.0", True),
    "libz": ("zlib (via cpp-httplib)", "Zlib", True),
    "libbrotlicommon": ("Brotli (via cpp-httplib)", "MIT", True),
    "libbrotlidec": ("Brotli (via cpp-httplib)", "MIT", True),
    "libbrotlienc": ("Brotli (via cpp-httplib)", "MIT", True),
    # Planned dependencies (issue 19), classified in advance.
    "libpcre2-8": ("PCRE2", "BSD-3-Clause WITH PCRE2-exception", True),
    "libutf8proc": ("utf8proc", "MIT", True),
    # Known GPL-only libraries: linking one would make the binary GPL.
    "libreadline": ("GNU Readline", "GPL-3.0-or-later", False),
    "libfftw3": ("FFTW", "GPL-2.0-or-later", False),
    "libfftw3f": ("FFTW", "GPL-2.0-or-later", False),
    "libgsl": ("GNU Scientific Library", "GPL-3.0-or-later", False),
}

LDD_RE = re.compile(r"^\s*(\S+?)(?:\s+=>\s+(\S+))?\s+\(0x[0-9a-f]+\)\s*$")


def soname_key(soname):
    """'libstdc++.so.6' -> 'libstdc++'; '/lib64/ld-linux-x86-64.so.2' -> 'ld-linux-x86-64'."""
    base = soname.rsplit("/", 1)[-1]
    return base.split(".so", 1)[0]


def classify(ldd_output):
    """Returns (lines, violations) for the text of `ldd BINARY`."""
    lines, violations = [], []
    for raw in ldd_output.splitlines():
        m = LDD_RE.match(raw)
        if not m:
            if raw.strip() and "statically linked" not in raw:
                violations.append(f"unparsed ldd line: {raw.strip()}")
            continue
        soname = m.group(1)
        key = soname_key(soname)
        entry = LIBRARIES.get(key)
        if entry is None:
            violations.append(f"{soname}: not classified; look up its licence and add it to "
                              f"LIBRARIES in scripts/check_licenses.py (and NOTICE)")
            continue
        project, licence, allowed = entry
        lines.append(f"{soname}: {project}, {licence}")
        if not allowed:
            violations.append(f"{soname}: {project} is {licence} (GPL-only): Strata is "
                              f"Apache-2.0 and must not link it")
    return lines, violations


def check(binary):
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        return [], [f"{binary}: ldd failed: {e}"]
    return classify(out)


def self_test():
    good = ("\tlinux-vdso.so.1 (0x00007ffd)\n"
            "\tlibhwy.so.1 => /lib/x86_64-linux-gnu/libhwy.so.1 (0x00007fa8)\n"
            "\tlibstdc++.so.6 => /lib/x86_64-linux-gnu/libstdc++.so.6 (0x00007fa8)\n"
            "\t/lib64/ld-linux-x86-64.so.2 (0x00007fa8)\n")
    lines, v = classify(good)
    assert v == [], v
    assert len(lines) == 4 and "Highway" in lines[1], lines
    gpl = good + "\tlibreadline.so.8 => /lib/x86_64-linux-gnu/libreadline.so.8 (0x00007fa8)\n"
    _, v = classify(gpl)
    assert len(v) == 1 and "GPL-only" in v[0] and "libreadline.so.8" in v[0], v
    unknown = good + "\tlibfoo.so.3 => /usr/lib/libfoo.so.3 (0x00007fa8)\n"
    _, v = classify(unknown)
    assert len(v) == 1 and "libfoo.so.3: not classified" in v[0], v
    _, v = classify("\tstatically linked\n")
    assert v == [], v
    print("check_licenses self-test: ok")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    bad = 0
    for binary in argv[1:]:
        lines, violations = check(binary)
        print(f"{binary}:")
        for line in lines:
            print(f"  {line}")
        for v in violations:
            print(f"  VIOLATION {v}")
        bad += len(violations)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

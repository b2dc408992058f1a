#!/usr/bin/env python3
"""Checks that tests/c/test_badinput.c has a bad-pointer entry for every
pointer parameter of every function in include/tent.h (handles aside: a
handle is an id, checked by the "(as a handle)" entries and test_capi.c).
So a new function, or a new pointer parameter, cannot skip the NULL,
near-NULL, PROT_NONE, read-only and page-edge cases, the out-parameters
among them.

Usage: check_badinput_args.py include/tent.h tests/c/test_badinput.c
"""
import re
import sys

HANDLE = re.compile(r"^(const\s+)?tent_(engine|region|segment|batch)\s*\*\s*\w+$")


def pointer_params(header):
    text = re.sub(r"/\*.*?\*/", " ", header, flags=re.S)
    for m in re.finditer(r"^tent_status\s+(tent_\w+)\s*\(([^)]*)\)\s*;", text, flags=re.M):
        fn, params = m.group(1), " ".join(m.group(2).split())
        for p in params.split(","):
            p = p.strip()
            if "*" not in p or HANDLE.match(p):
                continue
            yield fn, re.search(r"(\w+)$", p).group(1)


def main():
    header, suite = (open(path).read() for path in sys.argv[1:3])
    entries = set(re.findall(r'\{"(tent_\w+)", "(\w+)", PTRS', suite))
    missing = [(fn, arg) for fn, arg in pointer_params(header) if (fn, arg) not in entries]
    total = len(set(pointer_params(header)))
    for fn, arg in missing:
        print(f"FAILED: test_badinput.c has no bad-pointer entry for {fn}({arg})", file=sys.stderr)
    print(f"check_badinput_args: {total - len(missing)} of {total} pointer parameters covered")
    return 1 if missing or total == 0 else 0


if __name__ == "__main__":
    sys.exit(main())

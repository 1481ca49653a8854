#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fails when oomb/oomb.hpp and the public headers disagree.

Every header under include/oomb/ except the umbrella itself, oomb/cuda/ (needs nvcc), oomb/interop/
(opt-in: needs a format's header the program brings, such as dlpack.h) and any detail/ folder
(internals, reached through public headers) must be included by oomb/oomb.hpp,
and every include there must name an existing header. Usage: check_umbrella.py INCLUDE_DIR
"""
import pathlib
import re
import sys


def main() -> int:
    include = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "include").resolve()
    umbrella = include / "oomb" / "oomb.hpp"
    public = {
        p.relative_to(include).as_posix()
        for p in (include / "oomb").rglob("*.hpp")
        if p != umbrella
    }
    public = {h for h in public
              if not h.startswith(("oomb/cuda/", "oomb/interop/")) and "/detail/" not in h}
    listed = re.findall(r'^\s*#\s*include\s*[<"](oomb/[^>"]+)[>"]', umbrella.read_text(), re.M)
    missing = sorted(public - set(listed))
    stale = sorted(set(listed) - public)
    dupes = sorted({h for h in listed if listed.count(h) > 1})
    for h in missing:
        print(f"oomb/oomb.hpp does not include public header {h}: add '#include \"{h}\"'")
    for h in stale:
        print(f"oomb/oomb.hpp includes {h}, which is not a public header outside cuda/ and interop/")
    for h in dupes:
        print(f"oomb/oomb.hpp includes {h} more than once")
    if missing or stale or dupes:
        return 1
    print(f"oomb/oomb.hpp includes all {len(public)} public headers")
    return 0


if __name__ == "__main__":
    sys.exit(main())

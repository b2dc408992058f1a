"""The honest platform tag of a wheel that bundles libtent.so.

Reads the ELF file itself (no binutils needed):

- the machine (x86_64, aarch64);
- the shared libraries it links (DT_NEEDED);
- the newest GLIBC_x.y symbol version it requires (.gnu.version_r).

PEP 600 allows ``manylinux_X_Y_<arch>`` only if the library needs no glibc
newer than X.Y and links nothing but the libraries every such system has
(the manylinux policy's list; C++ runtimes excluded here because their own
symbol versions would need checking too). Otherwise the tag is the plain,
non-portable ``linux_<arch>``.

Usage: python wheel_tag.py path/to/libtent.so [--explain]
"""

from __future__ import annotations

import re
import struct
import sys
from typing import Dict, List, Tuple

# Libraries a manylinux system provides (PEP 600 / auditwheel policy), C only.
MANYLINUX_LIBS = {
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "librt.so.1",
    "libpthread.so.0",
    "libutil.so.1",
    "libresolv.so.2",
    "libnsl.so.1",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
}
MACHINES = {62: "x86_64", 183: "aarch64"}

SHT_DYNAMIC = 6
SHT_GNU_VERNEED = 0x6FFFFFFE
DT_NEEDED = 1


def _cstring(data: bytes, off: int) -> str:
    end = data.index(b"\0", off)
    return data[off:end].decode()


def inspect(path: str) -> Dict[str, object]:
    """{'machine': str, 'needed': [str], 'glibc': (x, y) or None,
    'versions': [str]} of a 64-bit little-endian ELF shared library."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path} is not a 64-bit little-endian ELF file")
    (e_machine,) = struct.unpack_from("<H", data, 18)
    (e_shoff,) = struct.unpack_from("<Q", data, 40)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 58)
    sections: List[Tuple[int, int, int, int, int]] = []  # type, offset, size, link, info
    for i in range(e_shnum):
        base = e_shoff + i * e_shentsize
        _name, sh_type, _flags, _addr, sh_offset, sh_size, sh_link, sh_info = struct.unpack_from(
            "<IIQQQQII", data, base
        )
        sections.append((sh_type, sh_offset, sh_size, sh_link, sh_info))
    needed: List[str] = []
    versions: List[str] = []
    for sh_type, off, size, link, info in sections:
        strtab = sections[link][1] if link < len(sections) else 0
        if sh_type == SHT_DYNAMIC:
            for pos in range(off, off + size, 16):
                tag, val = struct.unpack_from("<qQ", data, pos)
                if tag == 0:
                    break
                if tag == DT_NEEDED:
                    needed.append(_cstring(data, strtab + val))
        elif sh_type == SHT_GNU_VERNEED:
            pos = off
            for _ in range(info):  # Elf64_Verneed entries
                _ver, cnt, _file, aux, nxt = struct.unpack_from("<HHIII", data, pos)
                apos = pos + aux
                for _ in range(cnt):  # Elf64_Vernaux entries
                    _hash, _flags, _other, name, anext = struct.unpack_from("<IHHII", data, apos)
                    versions.append(_cstring(data, strtab + name))
                    apos += anext
                pos += nxt
                if nxt == 0:
                    break
    glibc = None
    for v in versions:
        m = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", v)
        if m:
            xy = (int(m.group(1)), int(m.group(2)))
            glibc = xy if glibc is None or xy > glibc else glibc
    return {
        "machine": MACHINES.get(e_machine, f"machine{e_machine}"),
        "needed": needed,
        "glibc": glibc,
        "versions": sorted(set(versions)),
    }


def decide(info: Dict[str, object]) -> Tuple[str, str]:
    """(platform tag, reason)."""
    arch = info["machine"]
    needed = info["needed"]
    glibc = info["glibc"]
    others = [lib for lib in needed if lib not in MANYLINUX_LIBS]  # type: ignore[union-attr]
    odd_versions = [v for v in info["versions"] if not v.startswith("GLIBC_")]  # type: ignore[union-attr]
    if others:
        return f"linux_{arch}", f"links {', '.join(others)}, which manylinux does not guarantee"
    if odd_versions:
        return f"linux_{arch}", f"needs symbol versions {', '.join(odd_versions)} outside glibc"
    if glibc is None:
        return f"linux_{arch}", "no GLIBC symbol versions found (not a glibc library?)"
    x, y = glibc
    # manylinux starts at glibc 2.5 (manylinux1).
    x, y = max((x, y), (2, 5))
    return (
        f"manylinux_{x}_{y}_{arch}",
        f"needs at most GLIBC_{glibc[0]}.{glibc[1]} and links only {', '.join(needed)}",  # type: ignore[arg-type]
    )


def platform_tag(path: str) -> str:
    return decide(inspect(path))[0]


if __name__ == "__main__":
    lib = sys.argv[1]
    tag, why = decide(inspect(lib))
    print(tag)
    if "--explain" in sys.argv:
        print(f"{lib}: {why}", file=sys.stderr)

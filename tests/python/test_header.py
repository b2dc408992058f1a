"""include/tent.h against the Python package's one table (tent._lib):
functions (names, return and argument types), struct layouts (fields in
order, their C types, and the offsets and sizes a C compiler computes),
#define constants, and one exception class per status code."""

import ctypes
import os
import re
import shutil
import subprocess
from ctypes import POINTER, c_char_p, c_int32, c_int64, c_size_t, c_uint16, c_uint32, c_uint64, c_void_p

import pytest

import tent
from tent import _errors, _lib

from conftest import SOURCE_DIR

HEADER = os.path.join(SOURCE_DIR, "include", "tent.h")


@pytest.fixture(scope="module")
def header():
    if not os.path.exists(HEADER):
        pytest.skip(f"{HEADER} not found (set TENT_SOURCE_DIR)")
    with open(HEADER) as f:
        return f.read()


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def without_preprocessor(text):
    # drop #define/#ifdef lines (with continuations) and extern "C" braces
    text = re.sub(r"^\s*#(?:[^\n]*\\\n)*[^\n]*", " ", text, flags=re.M)
    return re.sub(r'extern\s+"C"\s*\{|^\}\s*$', " ", text, flags=re.M)


HANDLES = {"tent_engine", "tent_region", "tent_segment", "tent_batch"}
SCALARS = {
    "uint16_t": c_uint16,
    "uint32_t": c_uint32,
    "uint64_t": c_uint64,
    "int64_t": c_int64,
    "int32_t": c_int32,
    "int": c_int32,
    "size_t": c_size_t,
    "tent_status": c_int32,
    "tent_log_fn": _lib.tent_log_fn,
}


def ctype_of(decl):
    """The ctypes type for a C type (without the parameter name)."""
    t = " ".join(decl.replace("*", " * ").split())
    t = re.sub(r"\bconst\b", "", t)
    t = " ".join(t.split())
    stars = t.count("*")
    base = t.replace("*", "").strip()
    if stars == 0:
        if base in SCALARS:
            return SCALARS[base]
        raise AssertionError(f"unmapped C type {decl!r}")
    if base in HANDLES:
        inner = c_void_p  # an opaque handle is a c_void_p holding an int id
        stars -= 1
    elif base == "char" and stars == 1:
        return c_char_p
    elif base == "void":
        inner = c_void_p
        stars -= 1
    elif base in _lib.STRUCTS:
        inner = _lib.STRUCTS[base]
        stars -= 1
        if stars == 0:
            return POINTER(inner)
    elif base in SCALARS:
        inner = SCALARS[base]
    else:
        raise AssertionError(f"unmapped C type {decl!r}")
    for _ in range(stars):
        inner = POINTER(inner)
    return inner


def split_param(p):
    """'const char *name' -> 'const char *'; 'tent_region *const *regions' -> its type."""
    p = p.strip()
    m = re.match(r"^(.*?)(\w+)\s*(\[\d*\])?$", p)
    assert m, p
    typ = m.group(1).strip()
    if not typ:  # a lone type, e.g. "void"
        return p
    return typ + (" *" if m.group(3) else "")


def parse_functions(text):
    body = without_preprocessor(strip_comments(text))
    body = re.sub(r"typedef struct \w+ \{.*?\} \w+;", " ", body, flags=re.S)
    out = {}
    for m in re.finditer(r"([A-Za-z_][\w\s\*]*?)\b(tent_\w+)\s*\(([^)]*)\)\s*;", body):
        ret, name, params = m.group(1), m.group(2), m.group(3)
        ret = " ".join(ret.split())
        if ret.startswith("typedef"):
            continue
        params = [p for p in (x.strip() for x in params.split(",")) if p]
        if params == ["void"]:
            params = []
        out[name] = (ret, [split_param(p) for p in params])
    return out


def parse_structs(text):
    body = strip_comments(text)
    out = {}
    for m in re.finditer(r"typedef struct (tent_\w+) \{(.*?)\} (tent_\w+);", body, flags=re.S):
        assert m.group(1) == m.group(3)
        fields = []
        for decl in m.group(2).split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            fm = re.match(r"^(.*?)(\w+)(?:\[(\d+)\])?$", decl)
            typ, fname, dim = fm.group(1).strip(), fm.group(2), fm.group(3)
            fields.append((fname, typ, int(dim) if dim else None))
        out[m.group(1)] = fields
    return out


def parse_defines(text):
    out = {}
    for m in re.finditer(r"^#define (TENT_\w+)[ \t]+(-?(?:0x[0-9A-Fa-f]+|\d+))u?\b", text, flags=re.M):
        out[m.group(1)] = int(m.group(2), 0)
    return out


# ---- the checks ---------------------------------------------------------------


def test_every_function_is_declared_with_the_header_types(header):
    funcs = parse_functions(header)
    assert len(funcs) >= 29, sorted(funcs)
    assert set(funcs) == set(_lib.FUNCTIONS), (
        f"in tent.h only: {sorted(set(funcs) - set(_lib.FUNCTIONS))}; "
        f"in tent._lib only: {sorted(set(_lib.FUNCTIONS) - set(funcs))}"
    )
    for name, (ret, params) in funcs.items():
        restype, argtypes = _lib.FUNCTIONS[name]
        assert restype is ctype_of(ret), f"{name}: returns {ret}, table says {restype}"
        want = [ctype_of(p) for p in params]
        assert argtypes == want, f"{name}({', '.join(params)}): table says {argtypes}, header means {want}"


def test_the_loaded_library_has_the_declarations():
    dll = _lib.lib()
    for name, (restype, argtypes) in _lib.FUNCTIONS.items():
        fn = getattr(dll, name)
        assert fn.restype is restype and fn.argtypes == argtypes, name


def test_struct_fields_match_the_header(header):
    structs = parse_structs(header)
    assert set(structs) == set(_lib.STRUCTS), sorted(structs)
    for cname, fields in structs.items():
        py = _lib.STRUCTS[cname]._fields_
        assert [f[0] for f in fields] == [f[0] for f in py], cname
        for (fname, typ, dim), (_, ptype) in zip(fields, py):
            if dim is not None:
                assert typ == "char" and ptype._type_ is ctypes.c_char and ptype._length_ == dim, (cname, fname)
                continue
            want = ctype_of(typ)
            if isinstance(want, type) and issubclass(want, ctypes._Pointer) and want._type_ is c_void_p:
                want = c_void_p  # tent_segment * in a struct is a handle: c_void_p
            assert ptype is want, f"{cname}.{fname}: {typ} is {want}, table says {ptype}"


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="no C compiler")
def test_struct_layouts_match_the_c_compiler(header, tmp_path):
    structs = parse_structs(header)
    lines = ["#include <stdio.h>", "#include <stddef.h>", f'#include "{HEADER}"', "int main(void) {"]
    for cname, fields in structs.items():
        lines.append(f'printf("{cname} sizeof %zu\\n", sizeof({cname}));')
        for fname, _, _ in fields:
            lines.append(f'printf("{cname} {fname} %zu\\n", offsetof({cname}, {fname}));')
    lines += ["return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    cc = shutil.which("gcc") or shutil.which("cc")
    subprocess.run([cc, "-std=c11", "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        cname, field, value = line.split()
        st = _lib.STRUCTS[cname]
        got = ctypes.sizeof(st) if field == "sizeof" else getattr(st, field).offset
        assert got == int(value), f"{cname}.{field}: C says {value}, ctypes {got}"


def test_numpy_dtypes_have_the_struct_layouts():
    np = pytest.importorskip("numpy")
    for dt, st in ((tent.request_dtype, _lib.Request), (tent.status_dtype, _lib.RequestStatus)):
        assert dt.itemsize == ctypes.sizeof(st)
        assert list(dt.names) == [f[0] for f in st._fields_]
        for name, ctype in st._fields_:
            assert dt.fields[name][1] == getattr(st, name).offset
            assert dt.fields[name][0].itemsize == ctypes.sizeof(ctype)
    assert isinstance(tent.request_dtype, np.dtype)


def test_constants_match_the_header(header):
    defines = parse_defines(header)
    assert "TENT_ERR_VERSION_MISMATCH" in defines and "TENT_OP_WRITE" in defines
    assert defines == _lib.CONSTANTS, (
        f"differ: { {k: (defines.get(k), _lib.CONSTANTS.get(k)) for k in set(defines) | set(_lib.CONSTANTS) if defines.get(k) != _lib.CONSTANTS.get(k)} }"
    )


def test_one_exception_class_per_status_code(header):
    codes = {v: k for k, v in parse_defines(header).items() if k.startswith("TENT_ERR_")}
    assert set(_errors.ERRORS) == set(codes)
    for code, cls in _errors.ERRORS.items():
        assert cls.code == code and cls.status == codes[code]
        assert issubclass(cls, tent.TentError)
        assert getattr(tent, cls.__name__) is cls, f"tent.{cls.__name__} is not exported"
        # The library knows each code (the texts are the C table).
        assert _errors.status_text(code) != "unknown status"


def test_package_version_matches_the_header(header):
    d = parse_defines(header)
    assert tent.__version__ == f"{d['TENT_VERSION_MAJOR']}.{d['TENT_VERSION_MINOR']}.{d['TENT_VERSION_PATCH']}"
    assert tent.version() == tent.__version__
    assert tent.version_info() == tuple(int(x) for x in tent.__version__.split("."))


def test_installed_package_ships_the_same_header(header):
    shipped = os.path.join(tent.get_include(), "tent.h")
    assert os.path.exists(shipped), "the wheel does not ship include/tent.h"
    with open(shipped) as f:
        assert f.read() == header, "the packaged tent.h differs from include/tent.h"

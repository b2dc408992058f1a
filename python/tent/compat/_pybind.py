"""Arguments taken the way Mooncake's bindings take them.

Mooncake's ``mooncake.engine`` is a pybind11 module: an argument its C++
signature cannot take never reaches the engine, the call raises
``TypeError`` ("incompatible function arguments") instead of returning a
code. What each C++ parameter type takes (measured against the real
wheel, every method and argument):

- ``uintptr_t`` / ``size_t`` / a batch id (shown as ``int``): ``int`` and
  its subclasses (``bool``, ``IntEnum``), anything else with ``__index__``
  or ``__int__`` (numpy integers, ``numpy.float32`` truncated, ``Decimal``);
  never a ``float`` (``numpy.float64`` included), ``None``, ``str`` or
  ``bytes``, nor a value outside 0 .. 2**64-1.
- ``std::string`` (``str``): ``str``, ``bytes``, ``bytearray``;
  ``const char *`` takes ``None`` as well.
- ``std::vector<uintptr_t>`` (``list[int]``): a sequence (list, tuple,
  range, numpy array, bytearray), never ``str``/``bytes``, a set, a dict or
  an iterator, with every element as above.
- an enum (``TransferOpcode``) or a class (``TransferNotify``): its own
  instances only (an int is not an opcode); a pointer parameter takes
  ``None``.
- a parameter pybind names ``argN`` cannot be passed by keyword.

``method(...)`` wraps a method in those conversions; the body gets the
converted values and never sees an argument the bindings would refuse.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

_U64 = 1 << 64
_NO_DEFAULT = object()


class Mismatch(Exception):
    """An argument the bindings would not convert. Raised by the converters
    (also from a method's body, for list elements converted there) and
    turned into the bindings' TypeError by the method wrapper."""


def uint(v: Any) -> int:
    """uintptr_t / size_t / uint64_t."""
    if type(v) is int:
        if 0 <= v < _U64:
            return v
        raise Mismatch
    if isinstance(v, float):
        raise Mismatch
    if not isinstance(v, int):
        t = type(v)
        # pybind tries PyNumber_Long on anything PyNumber_Check accepts
        if not (hasattr(t, "__index__") or hasattr(t, "__int__") or hasattr(t, "__float__")
                or isinstance(v, complex)):
            raise Mismatch
    try:
        n = int(v)
    except Exception:  # noqa: BLE001 - nan, inf, a complex, a failing __int__: all refused
        raise Mismatch from None
    if 0 <= n < _U64:
        return n
    raise Mismatch


def text(v: Any) -> str:
    """std::string: str, or bytes/bytearray (as UTF-8, undecodable bytes kept as surrogates)."""
    if isinstance(v, str):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "surrogateescape")
    raise Mismatch


def ctext(v: Any) -> Optional[str]:
    """const char *: as std::string, or None (a null pointer)."""
    return None if v is None else text(v)


def cbytes(v: Any) -> Optional[bytes]:
    """char * read as raw bytes: str (UTF-8), bytes, bytearray, or None."""
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode("utf-8", "surrogateescape")
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    raise Mismatch


def sequence(v: Any) -> Any:
    """std::vector<...>: v itself if pybind would iterate it (a sequence that
    is not str or bytes); the elements are the caller's to convert."""
    t = type(v)
    if t is list or t is tuple:
        return v
    if isinstance(v, (str, bytes, dict)) or not hasattr(t, "__getitem__"):
        raise Mismatch
    return v


def uints(v: Any) -> List[int]:
    """std::vector<uintptr_t>, every element converted."""
    return [uint(x) for x in sequence(v)]


def instance_of(cls: type, none: bool = False) -> Callable[[Any], Any]:
    """A class or enum parameter (a pointer, with none=True: None too)."""
    def convert(v: Any) -> Any:
        if isinstance(v, cls) or (none and v is None):
            return v
        raise Mismatch
    return convert


class Param:
    """One parameter: its name (None: positional only, shown argN as pybind
    shows it), the type pybind shows, its converter and default."""

    __slots__ = ("name", "shown", "convert", "default", "default_shown")

    def __init__(self, name: Optional[str], shown: str, convert: Callable[[Any], Any],
                 default: Any = _NO_DEFAULT, default_shown: Optional[str] = None) -> None:
        self.name, self.shown, self.convert, self.default = name, shown, convert, default
        self.default_shown = default_shown if default_shown is not None else repr(default)


def describe(params: Sequence[Param]) -> str:
    out = []
    for i, p in enumerate(params):
        s = f"{p.name or f'arg{i}'}: {p.shown}"
        if p.default is not _NO_DEFAULT:
            s += f" = {p.default_shown}"
        out.append(s)
    return ", ".join(out)


def incompatible(label: str, supported: Sequence[str], args: Sequence[Any], kwargs: Dict[str, Any],
                 constructor: bool = False) -> TypeError:
    """The TypeError pybind raises, in its words."""
    what = "constructor" if constructor else "function"
    lines = [f"{label}(): incompatible {what} arguments. The following argument types are supported:"]
    lines += [f"    {i}. {s}" for i, s in enumerate(supported, 1)]
    invoked = ", ".join(repr(a) for a in args)
    if kwargs:
        kw = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        invoked = f"{invoked}; kwargs: {kw}" if invoked else f"kwargs: {kw}"
    return TypeError("\n".join(lines) + "\n\nInvoked with: " + invoked)


def _bind(params: Sequence[Param], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[Any]:
    """The arguments in parameter order, defaults filled in; Mismatch for
    too many, too few, an unknown or repeated keyword."""
    if len(args) > len(params):
        raise Mismatch
    out = list(args)
    left = dict(kwargs)
    for p in params[len(args):]:
        if p.name is not None and p.name in left:
            out.append(left.pop(p.name))
        elif p.default is not _NO_DEFAULT:
            out.append(p.default)
        else:
            raise Mismatch
    if left:
        raise Mismatch
    return out


def method(owner: str, returns: str, *params: Param) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wraps a method of class ``owner`` (as pybind names it) so that it
    takes its arguments as the bindings do: the body is called with the
    converted values; an argument the bindings refuse, here or in the body
    (a Mismatch from a list's elements), raises their TypeError."""
    required = sum(1 for p in params if p.default is _NO_DEFAULT)
    full = len(params)
    converters = tuple(p.convert for p in params)
    defaults = tuple(p.default for p in params)
    signature = f"(self: {owner}, {describe(params)}) -> {returns}" if params else f"(self: {owner}) -> {returns}"

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                given = args if not kwargs and required <= len(args) <= full else _bind(params, args, kwargs)
                n = len(given)
                if n < full:
                    given = tuple(given) + defaults[n:]
                return fn(self, *[c(a) for c, a in zip(converters, given)])
            except Mismatch:
                raise incompatible(fn.__name__, [signature], (self,) + args, kwargs) from None
        call.__doc__ = f"{fn.__name__}{signature}\n\n{fn.__doc__ or ''}".rstrip()
        return call
    return wrap

"""The TentError hierarchy: one class per status code of tent.h.

Every failing library call raises through ``check()``: the class is chosen
by the status code, ``.code`` is the code and ``.message`` the library's
``tent_last_error()`` text, read on the same thread right after the call.
Classes also subclass the natural builtin (``NotFound`` is a ``KeyError``,
``Timeout`` a ``TimeoutError``, ...), so generic handlers keep working.
Nothing in this package logs an error and returns None.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple, Type, Union

from . import _lib


class TentError(Exception):
    """Base of every error tent raises.

    ``code`` is the tent.h status code (a negative ``TENT_ERR_*``; None for
    errors that have no code, such as a library that cannot be loaded),
    ``status`` its symbolic name and ``message`` the library's explanation.
    """

    code: Optional[int] = None
    status: str = ""

    def __init__(self, message: str = "", code: Optional[int] = None) -> None:
        if code is not None:
            self.code = code
        self.message = message or (self.status or type(self).__name__)
        # Only the message goes to the builtin base: OSError subclasses
        # would read (errno, strerror) from two arguments.
        Exception.__init__(self, self.message)

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.message

    def __reduce__(self):  # picklable (multiprocessing sends errors back)
        return (type(self), (self.message, self.code))


# (status name, class name, extra builtin base(s), docstring). The one table.
_TABLE: Tuple[Tuple[str, str, Union[None, type, Tuple[type, ...]], str], ...] = (
    ("INVALID_ARGUMENT", "InvalidArgument", ValueError, "An argument is invalid (also a ValueError)."),
    (
        "INVALID_HANDLE",
        "InvalidHandle",
        ValueError,
        "A closed, stale or foreign object or handle was used (also a ValueError, like a closed file).",
    ),
    ("OVERLAP", "Overlap", ValueError, "The memory overlaps a registered or in-flight region."),
    ("ALREADY_REGISTERED", "AlreadyRegistered", ValueError, "Exactly this memory is already registered."),
    ("NOT_REGISTERED", "NotRegistered", ValueError, "The local memory of a request is not registered."),
    ("BUSY", "Busy", None, "The resource is busy (e.g. transfers still use a region being unregistered)."),
    (
        "OUT_OF_RANGE",
        "OutOfRange",
        (IndexError, ValueError),
        "A range lies outside the registered memory (also an IndexError and a ValueError).",
    ),
    ("PERMISSION_DENIED", "PermissionDenied", PermissionError, "The peer's registration does not allow this access."),
    ("NOT_FOUND", "NotFound", KeyError, "A name (segment, transport) was not found (also a KeyError)."),
    ("UNSUPPORTED", "Unsupported", NotImplementedError, "Not supported here (e.g. GPU memory without a GPU)."),
    ("TRANSPORT", "TransportError", ConnectionError, "A transport failed (also a ConnectionError)."),
    ("TIMEOUT", "Timeout", TimeoutError, "A deadline passed (also a TimeoutError)."),
    ("CLOSED", "Closed", None, "The engine or transport was closed or uninstalled."),
    ("NO_MEMORY", "NoMemory", MemoryError, "Out of memory (also a MemoryError)."),
    ("INTERNAL", "InternalError", None, "A bug inside libtent (the message holds the details)."),
    (
        "FORKED",
        "ForkError",
        None,
        "Called in a process forked after libtent was loaded: start workers with 'spawn' or 'forkserver'.",
    ),
    ("AUTH", "AuthError", PermissionError, "A peer failed authentication (wrong or missing secret)."),
    ("PROTOCOL", "ProtocolError", None, "A peer sent a malformed or unexpected message."),
    ("BUFFER_TOO_SMALL", "BufferTooSmall", None, "An output buffer is too small."),
    ("CANCELED", "Canceled", None, "The operation was canceled."),
    ("NAME_IN_USE", "NameInUse", None, "The segment name is already in use."),
    ("VERSION_MISMATCH", "VersionMismatch", None, "Incompatible versions (of a peer, or of libtent itself)."),
)

ERRORS: Dict[int, Type[TentError]] = {}
_namespace = globals()
for _status, _cls_name, _builtin, _doc in _TABLE:
    _code = getattr(_lib, "TENT_ERR_" + _status)
    _extra = () if _builtin is None else _builtin if isinstance(_builtin, tuple) else (_builtin,)
    _bases: Tuple[type, ...] = (TentError, *_extra)
    _cls = type(_cls_name, _bases, {"__doc__": _doc, "code": _code, "status": "TENT_ERR_" + _status, "__module__": "tent"})
    ERRORS[_code] = _cls
    _namespace[_cls_name] = _cls
del _namespace, _status, _cls_name, _builtin, _doc, _code, _extra, _bases, _cls

# Names for type checkers and readers (assigned by the loop above).
InvalidArgument: Type[TentError]
InvalidHandle: Type[TentError]
Overlap: Type[TentError]
AlreadyRegistered: Type[TentError]
NotRegistered: Type[TentError]
Busy: Type[TentError]
OutOfRange: Type[TentError]
PermissionDenied: Type[TentError]
NotFound: Type[TentError]
Unsupported: Type[TentError]
TransportError: Type[TentError]
Timeout: Type[TentError]
Closed: Type[TentError]
NoMemory: Type[TentError]
InternalError: Type[TentError]
ForkError: Type[TentError]
AuthError: Type[TentError]
ProtocolError: Type[TentError]
BufferTooSmall: Type[TentError]
Canceled: Type[TentError]
NameInUse: Type[TentError]
VersionMismatch: Type[TentError]


class LibraryError(TentError, OSError):
    """libtent.so cannot be loaded or is not libtent (code None)."""

    __module__ = "tent"


TentError.__module__ = "tent"


def error_for(code: int, message: str = "") -> TentError:
    """The exception for a status code (a plain TentError for codes this
    package does not know, e.g. from a newer library)."""
    cls = ERRORS.get(code)
    if cls is None:
        return TentError(message or f"tent status {code}", code)
    return cls(message, code)


def last_error_message(code: int) -> str:
    """tent_last_error() of this thread, or the status text if it is empty."""
    dll = _lib.lib()
    msg = dll.tent_last_error()
    if msg:
        return msg.decode("utf-8", "replace")
    text = dll.tent_status_str(code)
    return text.decode("utf-8", "replace") if text else f"tent status {code}"


def check(code: int) -> int:
    """Returns code if it is not an error (TENT_OK or TENT_PENDING); else
    raises the matching TentError with the library's message."""
    if code >= 0:
        return code
    raise error_for(code, last_error_message(code))


def fork_error() -> TentError:
    """The ForkError of a call refused before it reached the library: in a
    child forked after libtent was loaded, a lock another thread of the
    parent held at the fork stays held forever, so calls that take one
    check first (the library's own check would come too late)."""
    return ForkError(
        "tent: this process was forked after libtent was loaded, and no tent call works in the child: "
        "create engines after exec instead, e.g. start workers with multiprocessing's \"spawn\" or "
        "\"forkserver\" method",
        _lib.TENT_ERR_FORKED,
    )


def status_text(code: int) -> str:
    """tent_status_str(code)."""
    return _lib.lib().tent_status_str(code).decode()

"""The TentError hierarchy: codes, messages, builtin bases, pickling."""

import pickle

import pytest

import tent
from tent import _errors, _lib

BUILTINS = {
    tent.InvalidArgument: ValueError,
    tent.InvalidHandle: ValueError,
    tent.Overlap: ValueError,
    tent.AlreadyRegistered: ValueError,
    tent.NotRegistered: ValueError,
    tent.OutOfRange: (IndexError, ValueError),  # outside a region, and a bad value
    tent.PermissionDenied: PermissionError,
    tent.NotFound: KeyError,
    tent.Unsupported: NotImplementedError,
    tent.TransportError: ConnectionError,
    tent.Timeout: TimeoutError,
    tent.NoMemory: MemoryError,
    tent.AuthError: PermissionError,
}


@pytest.mark.parametrize("cls", sorted(_errors.ERRORS.values(), key=lambda c: -c.code), ids=lambda c: c.__name__)
def test_each_class(cls):
    e = cls("the message")
    assert isinstance(e, tent.TentError)
    assert e.code == cls.code < 0
    assert e.message == "the message" and str(e) == "the message"
    assert cls.status.startswith("TENT_ERR_")
    if cls in BUILTINS:
        for base in BUILTINS[cls] if isinstance(BUILTINS[cls], tuple) else (BUILTINS[cls],):
            assert isinstance(e, base)
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cls and back.message == "the message" and back.code == cls.code


def test_not_found_str_is_the_message_not_a_repr():
    e = tent.NotFound("transport 'x' is not installed")
    assert str(e) == "transport 'x' is not installed"  # KeyError would show the repr
    with pytest.raises(KeyError):
        raise e


def test_check_raises_with_the_library_message(engine):
    with pytest.raises(tent.NotFound) as info:
        engine.uninstall("no-such-transport")
    assert info.value.code == _lib.TENT_ERR_NOT_FOUND
    assert "no-such-transport" in info.value.message
    # ok and pending are not errors
    assert _errors.check(_lib.TENT_OK) == 0 and _errors.check(_lib.TENT_PENDING) == 1


def test_unknown_code_is_a_plain_tent_error():
    e = _errors.error_for(-999, "from a newer library")
    assert type(e) is tent.TentError and e.code == -999


def test_fork_error_is_exported_and_library_error_has_no_code():
    assert tent.ForkError.code == _lib.TENT_ERR_FORKED
    assert tent.LibraryError("x").code is None and isinstance(tent.LibraryError("x"), OSError)


@pytest.mark.parametrize("timeout", [1, 0.5])
def test_unreachable_etcd_fails_within_the_engine_timeout(timeout):
    # Port 1 on loopback: nobody listens. The etcd wait is the engine's
    # timeout when it is shorter than the 5 s default dial timeout.
    import time

    start = time.monotonic()
    with pytest.raises(tent.Timeout) as info:
        tent.Engine(metadata="etcd://127.0.0.1:1", timeout=timeout)
    took = time.monotonic() - start
    assert "127.0.0.1:1" in str(info.value)
    assert took < timeout + 2, f"failed after {took:.2f} s with timeout={timeout}"

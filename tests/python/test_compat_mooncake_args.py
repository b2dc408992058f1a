"""Mooncake's arguments taken as its pybind11 bindings take them: a value
the C++ signature cannot take raises TypeError ("incompatible function
arguments") before the engine is reached, anything it can take reaches
the engine (and fails there with a code, if it must).

SIGNATURES are the real wheel's (mooncake-transfer-engine 0.3.13, each
method's ``__doc__``), and the accepted/refused values per parameter type
are what that wheel did with them, every method and argument."""

import decimal
import enum
import fractions

import numpy as np
import pytest

SIGNATURES = {
    "allocate_managed_buffer": "arg0: int",
    "batch_register_memory": "buffer_addresses: list[int], capacities: list[int], location: str = '*'",
    "batch_transfer_async": "target_hostname: str, buffers: list[int], peer_buffer_addresses: list[int], "
                            "lengths: list[int], opcode: mooncake.engine.TransferOpcode, transport_hint: str = ''",
    "batch_transfer_async_read": "target_hostname: str, buffers: list[int], peer_buffer_addresses: list[int], "
                                 "lengths: list[int], transport_hint: str = ''",
    "batch_transfer_async_write": "target_hostname: str, buffers: list[int], peer_buffer_addresses: list[int], "
                                  "lengths: list[int], transport_hint: str = ''",
    "batch_transfer_sync": "target_hostname: str, buffers: list[int], peer_buffer_addresses: list[int], "
                           "lengths: list[int], opcode: mooncake.engine.TransferOpcode, "
                           "notify: mooncake.engine.TransferNotify = None, transport_hint: str = ''",
    "batch_transfer_sync_read": "target_hostname: str, buffers: list[int], peer_buffer_addresses: list[int], "
                                "lengths: list[int], transport_hint: str = ''",
    "batch_transfer_sync_write": "target_hostname: str, buffers: list[int], peer_buffer_addresses: list[int], "
                                 "lengths: list[int], transport_hint: str = ''",
    "batch_unregister_memory": "arg0: list[int]",
    "free_managed_buffer": "arg0: int, arg1: int",
    "get_batch_transfer_status": "arg0: list[int]",
    "get_first_buffer_address": "arg0: str",
    "get_local_topology": "device_name: str = None",
    "initialize": "arg0: str, arg1: str, arg2: str, arg3: str",
    "initialize_ext": "arg0: str, arg1: str, arg2: str, arg3: str, arg4: str",
    "read_bytes_from_buffer": "arg0: int, arg1: int",
    "register_memory": "buffer_addr: int, capacity: int, location: str = '*'",
    "send_probe": "peer_server_name: str",
    "transfer_check_status": "arg0: int",
    "transfer_submit_write": "target_hostname: str, buffer: int, peer_buffer_address: int, length: int, "
                             "transport_hint: str = ''",
    "transfer_sync": "target_hostname: str, buffer: int, peer_buffer_address: int, length: int, "
                     "opcode: mooncake.engine.TransferOpcode, notify: mooncake.engine.TransferNotify = None, "
                     "transport_hint: str = ''",
    "transfer_sync_read": "target_hostname: str, buffer: int, peer_buffer_address: int, length: int, "
                          "transport_hint: str = ''",
    "transfer_sync_write": "target_hostname: str, buffer: int, peer_buffer_address: int, length: int, "
                           "transport_hint: str = ''",
    "unregister_memory": "arg0: int",
    "warmup_efa_segment": "segment_name: str",
    "write_bytes_to_buffer": "arg0: int, arg1: str, arg2: int",
}
RETURNS = {"read_bytes_from_buffer": "bytes", "get_local_topology": "str"}

# std::string parameters (None refused); the others shown as str are const char * (None passes)
STD_STRINGS = {"location", "transport_hint", "peer_server_name", "segment_name", ("get_first_buffer_address", 0)}


class _Index:
    def __index__(self):
        return 5


class _Int:
    def __int__(self):
        return 5


class _E(enum.IntEnum):
    A = 5


INT_TAKES = [True, np.int64(5), np.uint64(5), np.int32(5), np.bool_(True), np.float32(1.5), np.array(5),
             2 ** 64 - 1, _E.A, _Index(), _Int(), decimal.Decimal(5), fractions.Fraction(5, 1)]
INT_REFUSES = [1.5, np.float64(1.5), None, "5", b"5", -1, 2 ** 64]
STR_TAKES = [b"x", bytearray(b"x"), np.str_("x")]
STR_REFUSES = [5, memoryview(b"x")]
LIST_TAKES = [(1,), range(1, 2), np.array([1]), bytearray(b"\x01"), [True], [np.int64(1)], [np.float32(1.5)]]
LIST_REFUSES = [None, 1, "1", b"\x01", {1: 2}, {1}, iter([1]), [1.5], [None], ["1"], [-1], [2 ** 64],
                np.array([1.5])]


def _params(spec):
    out = []
    for i, p in enumerate(spec.split(", ")):
        name, shown = p.split(": ", 1)
        out.append((i, name, shown.split(" = ")[0], " = " in shown))
    return out


def _good(shown):
    import mooncake.engine as me

    return {"int": 1, "str": "127.0.0.1:1", "list[int]": [1], "mooncake.engine.TransferOpcode": me.TransferOpcode.Write,
            "mooncake.engine.TransferNotify": None}[shown]


def _cases():
    import mooncake.engine as me

    for method, spec in SIGNATURES.items():
        params = _params(spec)
        for i, name, shown, _ in params:
            std_string = name in STD_STRINGS or (method, i) in STD_STRINGS
            if shown == "int":
                takes, refuses = INT_TAKES, INT_REFUSES
            elif shown == "str":
                takes = STR_TAKES + ([] if std_string else [None])
                refuses = STR_REFUSES + ([None] if std_string else [])
            elif shown == "list[int]":
                takes, refuses = LIST_TAKES, LIST_REFUSES
            elif shown.endswith("TransferOpcode"):
                takes, refuses = [me.TransferOpcode.Read], [1, True, 1.0, None, np.int64(1), _E.A]
            else:  # TransferNotify *
                takes, refuses = [None, me.TransferNotify("n", "m")], ["x", 5, ("a", "b")]
            for v in takes:
                yield method, params, i, v, True
            for v in refuses:
                yield method, params, i, v, False


@pytest.fixture(scope="module")
def engine():
    """Never initialized: a call whose arguments convert fails in the engine, quickly."""
    from mooncake.engine import TransferEngine

    e = TransferEngine()
    yield e
    e.close()


def test_each_method_has_the_bindings_signature(engine):
    for method, spec in SIGNATURES.items():
        doc = getattr(type(engine), method).__doc__.splitlines()[0]
        assert doc == f"{method}(self: mooncake.engine.TransferEngine, {spec}) -> {RETURNS.get(method, 'int')}"


def test_arguments_are_converted_as_the_bindings_convert_them(engine):
    wrong = []
    n = 0
    for method, params, i, value, taken in _cases():
        args = [_good(shown) for _, _, shown, _ in params]
        args[i] = value
        n += 1
        try:
            getattr(engine, method)(*args)
            refused = False
        except TypeError as exc:
            assert f"{method}(): incompatible function arguments" in str(exc)
            assert SIGNATURES[method] in str(exc) and "Invoked with: " in str(exc)
            refused = True
        except ValueError:  # read_bytes_from_buffer outside this engine's memory: converted, then refused
            refused = False
        except RuntimeError:  # a None string converted (a null const char *), then the engine throws
            throws = params[i][1] == "target_hostname" or (method.startswith("initialize") and i != 3)
            assert throws and value is None, (method, params[i][1], value)
            refused = False
        if refused == taken:
            wrong.append(f"{method} {params[i][1]}={value!r}: {'refused' if refused else 'taken'}")
    assert not wrong, wrong
    assert n > 900


def test_keywords_as_the_bindings_name_them(engine):
    import mooncake.engine as me

    # argN parameters are positional only
    with pytest.raises(TypeError, match=r"Invoked with: .*; kwargs: buffer_addr=5"):
        engine.unregister_memory(buffer_addr=5)
    with pytest.raises(TypeError, match="incompatible"):
        engine.initialize(local_hostname="127.0.0.1", metadata_server="P2PHANDSHAKE", protocol="tcp", device_name="")
    # named ones by keyword, defaults as the bindings'
    assert engine.transfer_sync(target_hostname="h:1", buffer=1, peer_buffer_address=2, length=3,
                                opcode=me.TransferOpcode.Write, notify=None, transport_hint="tcp") == -1
    assert engine.register_memory(1, 2, location="cpu:0") == -1
    # too many, too few, an unknown keyword, a keyword repeating a positional
    for call in (lambda: engine.transfer_sync_write("h:1", 1, 2, 3, "", "extra"),
                 lambda: engine.transfer_sync_write("h:1", 1, 2),
                 lambda: engine.transfer_sync_write("h:1", 1, 2, 3, hint=""),
                 lambda: engine.transfer_sync_write("h:1", 1, 2, 3, buffer=1)):
        with pytest.raises(TypeError, match="incompatible function arguments"):
            call()


def test_a_refused_argument_comes_before_the_engine_is_asked():
    """The bindings convert every argument before calling: a bad element of
    a list is a TypeError even where the engine would have failed first
    (not initialized, an unknown peer), and nothing is logged as a failure."""
    from mooncake.engine import TransferEngine

    e = TransferEngine()
    try:
        with pytest.raises(TypeError):
            e.batch_transfer_sync_write("nobody:1", [1, 2], [3, 4.5], [8, 8])
        assert e.last_error == ""
        assert e.batch_transfer_sync_write("nobody:1", [1, 2], [3, 4], [8, 8]) == -1
        assert "not initialized" in e.last_error
    finally:
        e.close()


def test_transfer_notify_is_built_as_the_bindings_build_it():
    from mooncake.engine import TransferNotify

    assert (TransferNotify().name, TransferNotify().msg) == ("", "")
    n = TransferNotify(b"a", bytearray(b"b"))
    assert (n.name, n.msg) == ("a", "b") and isinstance(n.name, str)
    assert TransferNotify(name="x", msg="y") == TransferNotify("x", "y")
    for args, kwargs in (((("a", 5)), {}), (("a",), {}), ((), {"name": "a"}), ((None, "m"), {})):
        with pytest.raises(TypeError, match="incompatible constructor arguments"):
            TransferNotify(*args, **kwargs)
    n.name = b"zz"
    assert n.name == "zz"
    with pytest.raises(TypeError, match="incompatible function arguments"):
        n.msg = 5
    assert n.msg == "b"


TARGET_METHODS = [m for m, spec in SIGNATURES.items() if spec.startswith("target_hostname: str")]


@pytest.mark.parametrize("method", TARGET_METHODS)
def test_a_none_target_raises_runtime_error_as_the_engine_does(method):
    """The bindings take target_hostname=None (a const char *); Mooncake's
    engine then throws (a std::string made from the null pointer, its first
    use in every transfer method), which pybind11 raises as RuntimeError --
    on an initialized engine too, before the lists' lengths are compared.
    A list element the bindings refuse is still their TypeError, first."""
    import mooncake.engine as me

    e = me.TransferEngine()
    try:
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        params = _params(SIGNATURES[method])
        args = [_good(shown) for _, _, shown, _ in params]
        args[0] = None
        with pytest.raises(RuntimeError, match="null"):
            getattr(e, method)(*args)
        lists = [i for i, _, shown, _ in params if shown == "list[int]"]
        if lists:
            args[lists[0]] = [1, 2]  # lists of different lengths: still the RuntimeError
            with pytest.raises(RuntimeError):
                getattr(e, method)(*args)
            args[lists[0]] = [1.5]
            with pytest.raises(TypeError, match="incompatible function arguments"):
                getattr(e, method)(*args)
        assert e.last_error == ""  # raised, not a failed call
    finally:
        e.close()


@pytest.mark.parametrize("method,which", [("initialize", i) for i in range(4)] +
                         [("initialize_ext", i) for i in range(5)])
def test_initialize_with_none_is_what_the_engine_does(method, which):
    """The real engine (checked against its wheel, each case in a forked
    child): a None local_hostname, metadata_server or (initialize_ext's)
    metadata_type raises RuntimeError (a std::string made from the null
    pointer), a None device_name is taken; a None protocol crashes that
    process (strcmp on it), refused here with a RuntimeError instead.
    Nothing is started by a refused call."""
    import mooncake.engine as me

    args = ["127.0.0.1", "P2PHANDSHAKE", "tcp", ""] + (["p2p"] if method == "initialize_ext" else [])
    args[which] = None
    e = me.TransferEngine()
    try:
        if which == 3:
            assert getattr(e, method)(*args) == 0
            return
        with pytest.raises(RuntimeError, match="protocol" if which == 2 else "null"):
            getattr(e, method)(*args)
        assert e.get_engine() is None  # not started: a later initialize still works
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    finally:
        e.close()

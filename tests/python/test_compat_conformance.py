"""Where the shims once answered differently from the real Mooncake and
NIXL Python packages, checked against what those packages do (their
pybind modules, nixl._api and the nixl wheel's top-level package, and
the examples and tests shipped with them): each test here pins one
behaviour a program written against the real wheel relies on."""

import logging
import os
import pickle
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest


@pytest.fixture
def agent():
    from nixl._api import nixl_agent, nixl_agent_config

    a = nixl_agent("conformance", nixl_agent_config(backends=["UCX"]))
    yield a
    a.close()


# ---- nixl: the package and its logger --------------------------------------------


def test_nixl_package_carries_every_submodule_name():
    # The nixl wheel's top-level package re-exports what its submodules
    # define, so `from nixl import nixlXferDList` and `nixl.DRAM_SEG` work.
    import nixl
    import nixl._bindings as bindings
    import nixl._utils as utils

    for name in ("nixl_agent", "nixl_agent_config", "nixlXferDList", "nixlRegDList", "nixlRemoteDList",
                 "nixlXferTelemetry", "nixlNotFoundError", "nixlBackendError", "DRAM_SEG", "VRAM_SEG",
                 "NIXL_INIT_AGENT", "DEFAULT_COMM_PORT", "get_logger", "malloc_passthru", "verify_transfer"):
        assert hasattr(nixl, name), name
    assert nixl.nixlXferDList is bindings.nixlXferDList
    assert nixl.malloc_passthru is utils.malloc_passthru
    assert nixl._bindings is sys.modules["nixl._bindings"] and nixl.logging is sys.modules["nixl.logging"]
    from nixl import nixlNotFoundError, nixlXferDList  # noqa: F401


def test_get_logger_names_loggers_as_nixl():
    from nixl.logging import get_logger

    assert get_logger("_api").name == "nixl.api"
    assert get_logger("my_app.worker").name == "nixl.my_app.worker"  # the whole name, not its last part
    assert get_logger("__main__").name == "nixl.main__"
    assert isinstance(get_logger("x"), logging.Logger)


# ---- nixl: descriptor lists ---------------------------------------------------------


def test_descriptor_lists_are_true_even_when_empty(agent):
    # NIXL's lists have no length protocol: `if not descs` tests for the
    # None a failed get_*_descs returns, and an empty list passes it.
    from nixl._bindings import DRAM_SEG, nixlRegDList, nixlXferDList

    assert bool(nixlXferDList(DRAM_SEG)) and bool(nixlRegDList(DRAM_SEG))
    empty = agent.get_xfer_descs(np.zeros((0, 3), dtype=np.uint64), "DRAM")
    assert empty is not None and empty.isEmpty() and bool(empty)


def test_registration_meta_info_comes_back_as_bytes(agent):
    from nixl._bindings import DRAM_SEG, nixlRegDList, nixlRemoteDList

    reg = nixlRegDList(DRAM_SEG, [(4096, 64, 0, "layer-0"), (8192, 64, 0, b"\x00raw")])
    assert reg[0] == (4096, 64, 0, b"layer-0") and reg[1][3] == b"\x00raw"
    assert list(reg)[0][3] == b"layer-0"
    assert reg.index((8192, 64, 0, b"\x00raw")) == 1 and reg.index((4096, 64, 0, "layer-0")) == 0
    reg.addDesc((12288, 8, 0, "more"))
    assert reg[2] == (12288, 8, 0, b"more")
    # an array-built list has empty meta info, as bytes too
    assert nixlRegDList(DRAM_SEG, np.array([[1, 2, 0]], dtype=np.uint64))[0] == (1, 2, 0, b"")
    # through tent's serialization (and pickle) the bytes survive, binary ones included
    back = agent.deserialize_descs(agent.get_serialized_descs(reg))
    assert isinstance(back, nixlRegDList) and list(back) == list(reg)
    assert list(pickle.loads(pickle.dumps(reg))) == list(reg)
    # a remote descriptor's 4th field is the agent name, a str
    remote = nixlRemoteDList(DRAM_SEG, [(1, 2, 0, "peer")])
    assert remote[0] == (1, 2, 0, "peer")
    assert list(agent.deserialize_descs(agent.get_serialized_descs(remote))) == [(1, 2, 0, "peer")]


# ---- nixl: errors where NIXL raises or does not ------------------------------------


def test_an_unknown_operation_is_a_key_error_before_anything_else(agent):
    # NIXL looks the op up in nixl_ops first: KeyError, even with bogus handles.
    from nixl._bindings import DRAM_SEG, nixlXferDList

    with pytest.raises(KeyError):
        agent.make_prepped_xfer("RD", 0, [], 0, [])
    with pytest.raises(KeyError):
        agent.initialize_xfer("WR", nixlXferDList(DRAM_SEG), nixlXferDList(DRAM_SEG), "nobody")


def test_removing_an_unknown_remote_agent_is_not_an_error(agent):
    # NIXL's bindings drop invalidateRemoteMD's status: teardown code that
    # removes a peer twice (or one never added) runs on.
    agent.remove_remote_agent("never-added")
    agent.remove_remote_agent(b"never-added")


# ---- nixl: plugins and backends ---------------------------------------------------------


def test_an_unknown_plugin_is_empty_and_cannot_be_created(agent):
    from nixl._bindings import nixlNotFoundError

    # "UVX" is a typo of "UCX": empty answers (and a warning), as in NIXL
    assert agent.get_plugin_mem_types("UVX") == [] and agent.get_plugin_params("UVX") == {}
    assert agent.get_backend_mem_types("UVX") == [] and agent.get_backend_params("UVX") == {}
    with pytest.raises(nixlNotFoundError):
        agent.create_backend("UVX")
    assert "UVX" not in agent.backends
    # a plugin tent serves answers, instantiated or not
    assert "DRAM" in agent.get_plugin_mem_types("LIBFABRIC")
    assert "DRAM" in agent.get_backend_mem_types("UCX")
    assert agent.plugin_mem_types["LIBFABRIC"] and isinstance(agent.plugin_b_options, dict)


def test_config_backends_without_a_plugin_are_skipped():
    from nixl._api import nixl_agent, nixl_agent_config

    a = nixl_agent("skips", nixl_agent_config(backends=["UCX", "NO_SUCH_PLUGIN"]))
    try:
        assert list(a.backends) == ["UCX"]
        with pytest.raises(KeyError):  # as for any backend the agent does not have
            a.register_memory([(4096, 64, 0, "")], "DRAM", backends=["NO_SUCH_PLUGIN"])
    finally:
        a.close()


def test_instantiate_all_creates_every_plugin():
    from nixl._api import nixl_agent

    a = nixl_agent("all", nixl_conf=None, instantiate_all=True)
    try:
        assert len(a.plugin_list) == len(a.backends) and set(a.backends) == set(a.get_plugin_list())
    finally:
        a.close()


# ---- mooncake ---------------------------------------------------------------------------


def test_mc_force_tcp_selects_tcp_whatever_the_protocol(monkeypatch):
    from mooncake.engine import TransferEngine

    monkeypatch.setenv("MC_FORCE_TCP", "1")
    monkeypatch.delenv("TENT_COMPAT_TRANSPORTS", raising=False)
    e = TransferEngine()
    try:
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0
        assert list(e.get_engine().transports) == ["tcp"]
    finally:
        e.close()


# ---- nixl: the bindings' agent and configuration ------------------------------------------


@pytest.mark.parametrize("listen", [True, False])
def test_the_agent_is_built_on_the_bindings_agent_with_nixls_sync_mode(monkeypatch, listen):
    # nixl_agent builds nixl._bindings.nixlAgent(name, nixlAgentConfig) and
    # sets the sync mode NIXL's way; a test wrapping the bindings class sees it.
    import nixl._bindings as bindings
    from nixl._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t

    seen = {}
    real = bindings.nixlAgent

    def spy(name, config):
        seen["name"], seen["sync"], seen["port"] = name, config.syncMode, config.listenPort
        return real(name, config)

    monkeypatch.setattr(bindings, "nixlAgent", spy)
    for mode in (None, nixl_thread_sync_t.NIXL_THREAD_SYNC_RW):
        a = nixl_agent("spied", nixl_agent_config(enable_listen_thread=listen, listen_port=0, sync_mode=mode))
        try:
            default = nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT if listen else nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE
            assert seen == {"name": "spied", "sync": (mode or default).value, "port": 0}
            assert isinstance(a.agent, real) and a.plugin_list == a.agent.getAvailPlugins()
        finally:
            a.close()
    cfg = bindings.nixlAgentConfig(True, True, 1234)  # NIXL's positional order
    assert (cfg.useProgThread, cfg.useListenThread, cfg.listenPort, cfg.captureTelemetry) == (True, True, 1234, False)


def test_nixl_telemetry_enable_overrides_the_config(monkeypatch):
    from nixl._api import nixl_agent, nixl_agent_config
    from nixl._bindings import nixlNoTelemetryError

    mem = np.zeros(128, dtype=np.uint8)

    def telemetry_of(capture):
        a = nixl_agent("telemetry", nixl_agent_config(capture_telemetry=capture))
        try:
            a.register_memory([(mem.ctypes.data, 128, 0, "")], "DRAM")
            descs = a.get_xfer_descs([(mem.ctypes.data, 64, 0)], "DRAM")
            h = a.initialize_xfer("WRITE", descs, a.get_xfer_descs([(mem.ctypes.data + 64, 64, 0)], "DRAM"),
                                  "telemetry")
            a.transfer(h)
            while a.check_xfer_state(h) != "DONE":
                pass
            try:
                return a.get_xfer_telemetry(h).totalBytes
            except nixlNoTelemetryError:
                return None
        finally:
            a.close()

    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "no")
    assert telemetry_of(True) is None  # "no" wins over capture_telemetry=True
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "Y")
    assert telemetry_of(False) == 64
    monkeypatch.delenv("NIXL_TELEMETRY_ENABLE")
    assert telemetry_of(True) == 64 and telemetry_of(False) is None
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "maybe")
    with pytest.raises(RuntimeError):
        nixl_agent("bad-env")


def test_shim_modules_are_the_tent_modules():
    # nixl._bindings (and the others) are tent's modules themselves, so a
    # name patched on one is patched on both
    import mooncake.engine
    import nixl._api
    import nixl._bindings

    import tent.compat.mooncake
    import tent.compat.nixl._api
    import tent.compat.nixl._bindings

    assert nixl._bindings is tent.compat.nixl._bindings and nixl._api is tent.compat.nixl._api
    assert mooncake.engine is tent.compat.mooncake
    assert nixl._api.nixlBind is nixl._bindings


def test_a_listener_on_an_os_chosen_port_says_which(monkeypatch, capsys):
    # NIXL's scripts start a peer with port 0 and read the port off the
    # last field of this stderr line (at NIXL_LOG_LEVEL=INFO)
    from nixl._api import nixl_agent, nixl_agent_config

    monkeypatch.setenv("NIXL_LOG_LEVEL", "INFO")
    a = nixl_agent("listening", nixl_agent_config(True, True, 0))
    try:
        line = [ln for ln in capsys.readouterr().err.splitlines() if "MD listener is listening on port" in ln]
        assert len(line) == 1 and int(line[0].split()[-1]) == a.listen_port > 0
    finally:
        a.close()
    monkeypatch.setenv("NIXL_LOG_LEVEL", "WARN")
    a = nixl_agent("quiet", nixl_agent_config(True, True, 0))
    a.close()
    assert "MD listener" not in capsys.readouterr().err


# ---- mooncake: the HTTP metadata server command -----------------------------------------


def _metadata_server_command():
    exe = os.path.join(os.path.dirname(sys.executable), "mooncake_http_metadata_server")
    if os.path.exists(exe):
        return [exe]
    if os.environ.get("TENT_COMPAT_WHEEL"):  # the wheel is installed here: its command must be too
        pytest.fail(f"the tent-compat wheel installed no {exe}")
    return [sys.executable, "-m", "mooncake.http_metadata_server"]  # a source-tree run


def test_mooncake_http_metadata_server_command_as_mooncakes():
    # Mooncake's wheel installs `mooncake_http_metadata_server --port P
    # [--host H] [--log-level L]`; its server refuses a second PUT of an
    # rpc_meta key and stops cleanly on SIGTERM.
    proc = subprocess.Popen(_metadata_server_command() + ["--host", "127.0.0.1", "--port", "0",
                                                          "--log-level", "WARNING"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), line + proc.stderr.read()
        url = line.split()[-1]

        def call(method, key, body=None):
            req = urllib.request.Request(f"{url}?key={key}", data=body, method=method)
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    return r.status, r.read()
            except urllib.error.HTTPError as e:
                return e.code, e.read()

        assert call("PUT", "mooncake/rpc_meta/seg", b"first")[0] == 200
        assert call("PUT", "mooncake/rpc_meta/seg", b"second")[0] == 400
        assert call("GET", "mooncake/rpc_meta/seg") == (200, b"first")
        assert call("PUT", "mooncake/ram/seg", b"a")[0] == 200 and call("PUT", "mooncake/ram/seg", b"b")[0] == 200
        assert call("GET", "mooncake/ram/seg") == (200, b"b")  # other keys are overwritten, as in Mooncake
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_an_empty_nixl_telemetry_enable_is_unset(monkeypatch):
    from nixl._bindings import telemetry_enabled

    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", " ")
    assert telemetry_enabled(True) is True and telemetry_enabled(False) is False


def test_get_engine_is_an_inner_transfer_engine():
    # Mooncake's module names get_engine()'s class InnerTransferEngine
    import mooncake.engine as me

    e = me.TransferEngine()
    try:
        assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        assert isinstance(e.get_engine(), me.InnerTransferEngine)
    finally:
        e.close()


def test_nixl_loggers_write_info_to_stdout_as_nixls(monkeypatch, capsys):
    # NIXL configures its "nixl" logger to print INFO and up on stdout, not
    # propagating: a program's get_logger(__name__).info(...) lines show
    from nixl.logging import get_logger

    monkeypatch.setenv("NIXL_LOG_LEVEL", "INFO")
    log = get_logger("conformance_app")
    log.info("Test Complete.")
    out = capsys.readouterr().out
    assert " NIXL INFO " in out and "Test Complete." in out and "test_compat_conformance.py:" in out
    assert logging.getLogger("nixl").propagate is False
    monkeypatch.setenv("NIXL_LOG_LEVEL", "ERROR")
    get_logger("conformance_app").info("hidden")
    assert "hidden" not in capsys.readouterr().out
    monkeypatch.setenv("NIXL_LOG_LEVEL", "INFO")
    get_logger("conformance_app")  # the level back for the tests after this one


def _ipv6_loopback():
    import socket

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_ipv6_hostnames_are_read_as_mooncake_reads_them():
    # Mooncake's parseHostNameWithPort: a bare IPv6 address has no port, a
    # scope ends at the colon before a port, brackets as usual
    from tent.compat._common import split_host_port

    assert split_host_port("::1") == ("[::1]", 0)
    assert split_host_port("2001:db8::1") == ("[2001:db8::1]", 0)
    assert split_host_port("[::1]:17813") == ("[::1]", 17813)
    assert split_host_port("fe80::a236:bcff:fecb:a1be%eno2:15773") == ("[fe80::a236:bcff:fecb:a1be%eno2]", 15773)
    assert split_host_port("fe80::a236:bcff:fecb:a1be%eno2") == ("[fe80::a236:bcff:fecb:a1be%eno2]", 0)
    assert split_host_port("192.168.1.1:8080") == ("192.168.1.1", 8080)
    assert split_host_port("localhost") == ("localhost", 0)


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback")
def test_a_bare_ipv6_local_hostname_initializes_with_p2phandshake():
    # SGLang passes the host's address as it is ("::1") and builds the
    # session as "[::1]:<rpc port>", which Mooncake's segment name is
    from mooncake.engine import TransferEngine

    target, initiator = TransferEngine(), TransferEngine()
    try:
        assert target.initialize("::1", "P2PHANDSHAKE", "tcp", "") == 0
        assert initiator.initialize("::1", "P2PHANDSHAKE", "tcp", "") == 0
        session = f"[::1]:{target.get_rpc_port()}"
        src, dst = np.arange(4096, dtype=np.uint8), np.zeros(4096, np.uint8)
        assert target.register_memory(dst.ctypes.data, dst.nbytes) == 0
        assert initiator.register_memory(src.ctypes.data, src.nbytes) == 0
        assert initiator.get_first_buffer_address(session) == dst.ctypes.data
        assert initiator.transfer_sync_write(session, src.ctypes.data, dst.ctypes.data, 4096) == 0
        assert np.array_equal(src, dst) and initiator.send_probe(session) == 0
    finally:
        target.close()
        initiator.close()


def test_a_region_registered_twice_is_deregistered_twice(agent):
    # NIXL registers a descriptor each time it is given (in one list or in
    # two calls) and each registration is deregistered on its own: a
    # worker's shutdown deregisters every list it registered
    import nixl._bindings as bindings

    mem = np.zeros(8192, np.uint8)
    row = (mem.ctypes.data, mem.nbytes, 0, "")
    first = agent.register_memory([row], "DRAM")
    second = agent.register_memory([row, row], "DRAM")
    assert agent.tent_engine.stats()["regions"] == 1  # one tent registration behind them
    agent.deregister_memory(second)
    assert agent.query_memory([row], "UCX", "DRAM")[0] is not None  # the first still holds it
    agent.deregister_memory(first)
    assert agent.tent_engine.stats()["regions"] == 0
    with pytest.raises(bindings.nixlNotFoundError):
        agent.deregister_memory(first)

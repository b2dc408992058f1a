"""Where the shims once answered differently from the real Mooncake and
NIXL Python packages, checked against what those packages do (their
pybind modules, nixl._api and the nixl wheel's top-level package, and
the examples and tests shipped with them): each test here pins one
behaviour a program written against the real wheel relies on."""

import logging
import pickle
import sys

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

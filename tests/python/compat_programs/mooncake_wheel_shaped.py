"""A program written against Mooncake's Python API the way Mooncake's own
wheel tests are (transfer_engine_target.py with
transfer_engine_initiator_test.py): configured from the environment
(TARGET_SERVER_NAME, INITIATOR_SERVER_NAME, MC_METADATA_SERVER, PROTOCOL),
a target that exposes one buffer, and an initiator that is a unittest
suite: byte strings written and read back through its own buffer, batches
of writes and reads, async batches polled with get_batch_transfer_status,
a write with a TransferNotify the target receives after the data, probes,
and an unknown peer.

Memory is numpy. The target's buffer starts as random bytes from a seed;
the initiator's last test writes a pattern from another seed over part
of it, and the target, told to stop on stdin, reports the crc32 of that
part and of the untouched rest, which the driver computes independently. It imports only
``mooncake.engine`` by name; stdout lines are JSON (with tent's leak
counts when it runs on tent).

    python mooncake_wheel_shaped.py target      # prints {"ready": ...}, stops on a line on stdin
    python mooncake_wheel_shaped.py initiator   # the unittest suite; REPORT=path gets its JSON report
"""

import json
import os
import random
import sys
import time
import unittest
import zlib

import numpy as np

from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode

BUFFER = 4 << 20
PATTERN_OFFSET, PATTERN_BYTES = 1 << 20, 1 << 20  # where the initiator's last test leaves its pattern
TARGET_SEED, PATTERN_SEED = 11, 12


def env():
    return (os.getenv("TARGET_SERVER_NAME", "127.0.0.1:12345"), os.getenv("INITIATOR_SERVER_NAME", "127.0.0.1:12347"),
            os.getenv("MC_METADATA_SERVER", "P2PHANDSHAKE"), os.getenv("PROTOCOL", "tcp"))


def pattern():
    return np.random.default_rng(PATTERN_SEED).integers(0, 256, PATTERN_BYTES, dtype=np.uint8)


def target_buffer():
    return np.random.default_rng(TARGET_SEED).integers(0, 256, BUFFER, dtype=np.uint8)


def region_crcs(buf):
    """crc32 of the pattern's region and of everything after it (which no
    test writes) of a target buffer."""
    end = PATTERN_OFFSET + PATTERN_BYTES
    return {"pattern_crc": zlib.crc32(memoryview(buf[PATTERN_OFFSET:end])), "tail_crc": zlib.crc32(memoryview(buf[end:]))}


def expected_target_crcs():
    """region_crcs of the target buffer once the initiator's suite ran."""
    buf = target_buffer()
    buf[PATTERN_OFFSET:PATTERN_OFFSET + PATTERN_BYTES] = pattern()
    return region_crcs(buf)


def tent_counts(engine):
    """tent's leak counts (open peer segments aside: Mooncake keeps them
    until the engine goes) and the bytes each transport moved; {} when
    not on tent."""
    inner = engine.get_engine()
    if not hasattr(inner, "stats"):
        return {}
    s = inner.stats()
    leaks = {k: s[k] for k in ("regions", "registered_bytes", "batches", "requests_in_flight", "allocations") if s[k]}
    moved = {t: v.get("bytes", 0) + v.get("bytes_sent", 0) + v.get("bytes_received", 0)
             for t, v in s["transports"].items()}
    return {"leaks": leaks, "moved": moved}


def process_handles():
    try:
        import tent
    except ImportError:
        return None
    with tent.Engine() as probe:
        return int(probe.stats()["process_handles"]) - 1


def target():
    name, _, metadata, protocol = env()
    engine = TransferEngine()
    if engine.initialize(name, metadata, protocol, "") != 0:
        raise RuntimeError("target initialization failed")
    if metadata == "P2PHANDSHAKE":
        name = name.rpartition(":")[0] + ":" + str(engine.get_rpc_port())
    buf = target_buffer()
    if engine.register_memory(buf.ctypes.data, buf.nbytes) != 0:
        raise RuntimeError("target registration failed")
    assert engine.get_first_buffer_address(name) == buf.ctypes.data
    print(json.dumps({"ready": True, "segment": name, "buffer": buf.ctypes.data}), flush=True)
    sys.stdin.readline()  # the driver's "stop" (Mooncake's target spins forever)
    notes = [(n.name, n.msg) for n in engine.get_notifies()]
    crcs = region_crcs(buf)
    assert engine.unregister_memory(buf.ctypes.data) == 0
    counts = tent_counts(engine)
    if hasattr(engine, "close"):
        engine.close()
    print(json.dumps({**crcs, "notifies": notes, **counts, "process_handles": process_handles()}), flush=True)
    return 0


class TestMooncakeShaped(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.target_name, cls.own_name, metadata, protocol = env()
        cls.engine = TransferEngine()
        if cls.engine.initialize(cls.own_name, metadata, protocol, "") != 0:
            raise RuntimeError("initiator initialization failed")
        if metadata == "P2PHANDSHAKE":
            cls.own_name = cls.own_name.rpartition(":")[0] + ":" + str(cls.engine.get_rpc_port())
        cls.src = cls.engine.allocate_managed_buffer(BUFFER)
        if cls.src == 0:
            raise RuntimeError("allocate_managed_buffer failed")
        cls.dst = cls.engine.get_first_buffer_address(cls.target_name)

    @classmethod
    def tearDownClass(cls):
        assert cls.engine.free_managed_buffer(cls.src, BUFFER) == 0
        counts = tent_counts(cls.engine)
        if hasattr(cls.engine, "close"):
            cls.engine.close()
        report = os.getenv("REPORT")
        if report:
            with open(report, "w") as f:
                json.dump({**counts, "process_handles": process_handles()}, f)

    def test_1_write_read_strings(self):
        e = self.engine
        self.assertNotEqual(self.dst, 0, "the target has no registered buffer")
        rng = random.Random(1)
        for i in range(50):
            data = bytes(rng.randrange(32, 127) for _ in range(rng.randint(16, 256)))
            self.assertEqual(e.write_bytes_to_buffer(self.src, data, len(data)), 0)
            self.assertEqual(e.transfer_sync_write(self.target_name, self.src, self.dst, len(data)), 0)
            self.assertEqual(e.write_bytes_to_buffer(self.src, bytes(len(data)), len(data)), 0)
            self.assertEqual(e.transfer_sync_read(self.target_name, self.src, self.dst, len(data)), 0)
            self.assertEqual(e.read_bytes_from_buffer(self.src, len(data)), data, f"round {i}")

    def test_2_batches(self):
        e, n, stride = self.engine, 64, 4096
        srcs = [self.src + i * stride for i in range(n)]
        dsts = [self.dst + i * stride for i in range(n)]
        lens = [1024 + 7 * i for i in range(n)]
        local = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * BUFFER).from_address(self.src))
        data = np.random.default_rng(3).integers(0, 256, n * stride, dtype=np.uint8)
        local[:n * stride] = data
        self.assertEqual(e.batch_transfer_sync_write(self.target_name, srcs, dsts, lens), 0)
        local[:n * stride] = 0
        self.assertEqual(e.batch_transfer_sync_read(self.target_name, srcs, dsts, lens), 0)
        for i in range(n):
            a = i * stride
            self.assertTrue(np.array_equal(local[a:a + lens[i]], data[a:a + lens[i]]), i)
        # the same through async batches, as numpy arrays of addresses
        ids = [e.batch_transfer_async_write(self.target_name, np.array(srcs), np.array(dsts), np.array(lens)),
               e.batch_transfer_async(self.target_name, srcs[:8], dsts[:8], lens[:8], TransferOpcode.Write)]
        self.assertTrue(all(ids))
        self.assertEqual(e.get_batch_transfer_status(ids), 0)
        one = e.transfer_submit_write(self.target_name, self.src, self.dst, 512)
        deadline = time.monotonic() + 30
        while (state := e.transfer_check_status(one)) == 0:
            self.assertLess(time.monotonic(), deadline)
        self.assertEqual(state, 1)

    def test_3_probe_and_unknown_peer(self):
        e = self.engine
        self.assertEqual(e.send_probe(self.target_name), 0)
        self.assertNotEqual(e.send_probe("127.0.0.1:1"), 0)
        self.assertEqual(e.batch_transfer_async_write("127.0.0.1:1", [self.src], [self.dst], [64]), 0)
        self.assertLess(e.transfer_sync_write("127.0.0.1:1", self.src, self.dst, 64), 0)

    def test_4_pattern_with_notify(self):
        # the last write: a pattern the target's crc must show, then a notify
        e = self.engine
        local = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * BUFFER).from_address(self.src))
        local[:PATTERN_BYTES] = pattern()
        half = PATTERN_BYTES // 2
        self.assertEqual(e.batch_transfer_sync(self.target_name, [self.src], [self.dst + PATTERN_OFFSET], [half],
                                               TransferOpcode.Write), 0)
        self.assertEqual(e.transfer_sync(self.target_name, self.src + half, self.dst + PATTERN_OFFSET + half, half,
                                         TransferOpcode.Write, TransferNotify("initiator", "pattern-written")), 0)


def main():
    if sys.argv[1:2] == ["target"]:
        return target()
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(TestMooncakeShaped)
    return 0 if unittest.TextTestRunner(verbosity=1).run(suite).wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())

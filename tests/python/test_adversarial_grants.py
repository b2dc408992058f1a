"""What a peer may do with another process's memory, over every transport
that crosses processes: exactly what the target's registration allows.
A write into read-only memory and a read of write-only memory fail with
PermissionDenied and move nothing, whether the memory was registered or
allocated (an allocation may travel as a memfd only with both
permissions), after a permitted read of the same region (a cached grant
for reading is no grant for writing), and after the target re-registered
a region read-only that the initiator had written before (its cached
view and grants are stale). A range that runs one byte past a region
moves nothing either."""

import json
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest

import tent

from conftest import cross_process_transports, leaks

SIZE = 1 << 16

_TARGET = textwrap.dedent(
    """
    import json, sys, zlib
    import numpy as np
    import tent

    SIZE = 1 << 16
    e = tent.Engine(transports=sys.argv[1])
    keep = {name: np.full(SIZE, i + 1, np.uint8) for i, name in enumerate(["ro_reg", "wo_reg", "rw_reg"])}
    regions = {
        "ro_alloc": e.alloc(SIZE, remote_write=False),
        "wo_alloc": e.alloc(SIZE, remote_read=False),
        "ro_reg": e.register(keep["ro_reg"], remote_write=False),
        "wo_reg": e.register(keep["wo_reg"], remote_read=False),
        "rw_reg": e.register(keep["rw_reg"]),
    }
    for i, name in enumerate(["ro_alloc", "wo_alloc"]):
        regions[name].view()[:] = bytes([0x10 + i]) * SIZE

    def crc(name):
        r = regions[name]
        return zlib.crc32(r.view() if name.endswith("alloc") else keep[name])

    print(json.dumps({"name": e.name, "addr": {k: r.addr for k, r in regions.items()},
                      "crc": {k: crc(k) for k in regions}}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "crc":
            reply = {k: crc(k) for k in regions}
        elif cmd["cmd"] == "reregister_read_only":
            regions["rw_reg"].close()
            regions["rw_reg"] = e.register(keep["rw_reg"], remote_write=False)
            reply = {"ok": True}
        else:
            break
        print(json.dumps(reply), flush=True)
    for r in regions.values():
        r.close()
    e.close()
    """
)


class Target:
    def __init__(self, transport):
        self.proc = subprocess.Popen([sys.executable, "-c", _TARGET, transport], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        hello = json.loads(self.proc.stdout.readline())
        self.name, self.addr, self.crc0 = hello["name"], hello["addr"], hello["crc"]

    def call(self, cmd):
        self.proc.stdin.write(json.dumps({"cmd": cmd}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        try:
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.close()
            assert self.proc.wait(30) == 0
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(params=cross_process_transports())
def pair(request):
    t = request.param
    target = Target(t)
    try:
        with tent.Engine(transports=t, timeout=10) as e:
            seg = e.open_segment(target.name)
            buf = np.full(SIZE, 0x5A, np.uint8)
            region = e.register(buf)
            yield t, e, seg, region, buf, target
            region.close()
            seg.close()
            assert leaks(e) == {}
    finally:
        target.close()


def _denied(call, *args, **kw):
    with pytest.raises(tent.PermissionDenied):
        call(*args, **kw)


def test_read_only_memory_refuses_writes(pair):
    t, e, seg, region, buf, target = pair
    for name, fill in (("ro_alloc", 0x10), ("ro_reg", 1)):
        _denied(e.write, region, seg, target.addr[name], transport=t)
        _denied(e.write, region, seg, target.addr[name] + 4096, 64, transport=t)
        # a permitted read first: its grant does not cover a write
        e.read((region, 0), seg, target.addr[name], 4096, transport=t)
        assert (buf[:4096] == fill).all()
        _denied(e.write, (region, 0), seg, target.addr[name], 4096, transport=t)
        b = e.transfer([("read", region, seg, target.addr[name], 64), ("write", region, seg, target.addr[name] + 64, 64)],
                       transport=t)
        with pytest.raises(tent.PermissionDenied):
            b.wait()
        codes = [r.code for r in b.status()]
        b.close()
        assert codes == [0, tent.PermissionDenied.code], codes
    assert target.call("crc") == target.crc0, "a denied write changed the target's memory"


def test_write_only_memory_refuses_reads(pair):
    t, e, seg, region, buf, target = pair
    for name in ("wo_alloc", "wo_reg"):
        buf[:] = 0x5A
        _denied(e.read, region, seg, target.addr[name], transport=t)
        _denied(e.read, (region, 0), seg, target.addr[name] + 64, 64, transport=t)
        e.write((region, 0), seg, target.addr[name], 64, transport=t)  # allowed
        _denied(e.read, (region, 0), seg, target.addr[name], 64, transport=t)
        assert (buf == 0x5A).all(), "a denied read moved bytes"


def test_a_region_re_registered_read_only_refuses_writes(pair):
    t, e, seg, region, buf, target = pair
    addr = target.addr["rw_reg"]
    e.write((region, 0), seg, addr, 4096, transport=t)
    e.read((region, 0), seg, addr, 4096, transport=t)
    assert target.call("reregister_read_only") == {"ok": True}
    before = target.call("crc")["rw_reg"]
    buf[:] = 0x33
    for _ in range(3):
        _denied(e.write, (region, 0), seg, addr, 4096, transport=t)
    e.read((region, 4096), seg, addr, 4096, transport=t)  # reading is still allowed
    assert target.call("crc")["rw_reg"] == before, "a write landed in memory re-registered read-only"


def test_a_range_one_byte_past_a_region_moves_nothing(pair):
    t, e, seg, region, buf, target = pair
    addr = target.addr["rw_reg"]
    before = target.call("crc")["rw_reg"]
    with pytest.raises((tent.OutOfRange, tent.NotRegistered)):
        e.write((region, 0), seg, addr + SIZE - 64, 65, transport=t)
    with pytest.raises((tent.OutOfRange, tent.NotRegistered)):
        e.write((region, 0), seg, addr - 1, 64, transport=t)
    with pytest.raises((tent.OutOfRange, tent.NotRegistered, tent.InvalidArgument)):
        e.write((region, 0), seg, (1 << 64) - 32, 32, transport=t)
    assert target.call("crc")["rw_reg"] == before
    assert zlib.crc32(buf) == zlib.crc32(np.full(SIZE, 0x5A, np.uint8))

"""The NIC a request went through, in its status and in stats: rdma
between two engines of this process over the fake libibverbs (two fake
NICs; the fake moves the bytes with process_vm_writev/readv, here into this
process itself). The rdma part runs in a child process: libtent reads
its environment (where the fake library is) once, when it is loaded."""

import os
import subprocess
import sys

import numpy as np

import tent
from tent import _lib
from test_bench import build_fake_verbs


def rdma_stats(e):
    return e.stats()["transports"]["rdma"]


def test_status_and_stats_name_the_nic(tmp_path):
    state = tmp_path / "fakeverbs-state"
    state.mkdir()
    env = dict(os.environ, TENT_RDMA_VERBS_LIBRARY=str(build_fake_verbs(tmp_path)), FAKEVERBS_DEVICES="fake0,fake1",
               FAKEVERBS_STATE=str(state), FAKEVERBS_FAIL="")
    p = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(os.path.abspath(__file__)))
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr


def status_and_stats_name_the_nic():
    n, block = 32, 4096
    with tent.Engine(transports=["rdma"], timeout=10) as a, tent.Engine(transports=["rdma"], timeout=10) as b:
        src = np.random.default_rng(3).integers(0, 255, n * block, dtype=np.uint8)
        dst = np.zeros_like(src)
        with a.register(src) as rs, b.register(dst, remote_write=True, remote_read=True) as rd, \
                a.open_segment(b.name) as seg:
            offs = np.arange(n, dtype=np.int64) * block
            before = rdma_stats(a)
            reqs = tent.make_requests("write", rs, seg, rd.addr, local_offsets=offs, lengths=block)
            with a.transfer(reqs, transport="rdma") as batch:
                batch.wait(timeout=20)
                results = batch.status()
                arr = batch.status_array()
            assert np.array_equal(src, dst)
            after = rdma_stats(a)
            index = {after[f"nic.{d}.index"]: d for d in ("fake0", "fake1")}
            assert sorted(index) == [0, 1]
            per_nic = {0: 0, 1: 0}
            for r in results:
                assert r.ok and r.transport == "rdma" and r.nics == 1 and r.nic in index, r
                per_nic[r.nic] += 1
            for i, d in index.items():
                assert per_nic[i] > 0, "small requests rotate over both NICs"
                assert after[f"nic.{d}.requests"] - before.get(f"nic.{d}.requests", 0) == per_nic[i]
            assert (arr["flags"] & _lib.TENT_STATUS_NIC == _lib.TENT_STATUS_NIC).all()
            assert list(arr["nic"]) == [r.nic for r in results]

            # One 8 MiB request stripes over both NICs.
            big = np.zeros(8 << 20, dtype=np.uint8)
            with b.register(big, remote_read=True) as rb, a.register(np.empty_like(big)) as rl:
                with a.transfer([("read", rl, seg, rb.addr, big.nbytes)], transport="rdma") as batch:
                    batch.wait(timeout=20)
                    (r,) = batch.status()
                assert r.ok and r.nics == 2 and r.nic in index, r


def test_no_nic_for_local(engine, self_segment):
    src = np.ones(4096, dtype=np.uint8)
    dst = np.zeros_like(src)
    with engine.register(src) as rs, engine.register(dst) as rd:
        with engine.transfer([("write", rs, self_segment, rd.addr, 4096)]) as batch:
            batch.wait(timeout=10)
            (r,) = batch.status()
            arr = batch.status_array()
        assert r.ok and r.transport == "local" and r.nic is None and r.nics == 0, r
        assert int(arr["flags"][0]) & _lib.TENT_STATUS_NIC == 0 and int(arr["nic"][0]) == 0 and int(arr["nics"][0]) == 0


if __name__ == "__main__":
    status_and_stats_name_the_nic()
    print("ok")

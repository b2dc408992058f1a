"""Checks a topology JSON (tent_topology_json) against what the fake NVML
reports for the FAKENVML_* settings in the environment, or, with --no-nvml,
against the answer of a machine without NVML.

    python3 check_topology.py [--from-lib build/libtent.so | --from-stdin] [--no-nvml] [--old-driver]

--from-lib loads the library with ctypes (CPython: RTLD_NOW) and calls
tent_topology_json; --from-stdin reads the JSON another program printed.
"""
import argparse
import ctypes
import json
import os
import sys


def from_lib(path):
    lib = ctypes.CDLL(path)
    lib.tent_topology_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
    lib.tent_topology_json.restype = ctypes.c_int
    buf = ctypes.create_string_buffer(1 << 16)
    n = ctypes.c_size_t()
    st = lib.tent_topology_json(buf, len(buf), ctypes.byref(n))
    if st != 0:
        sys.exit(f"tent_topology_json: status {st}")
    return json.loads(buf.raw[: n.value])


def expected_fake(old_driver):
    """The topology fakenvml.c reports for this environment's settings."""
    env = os.environ
    n = int(env.get("FAKENVML_GPUS", "2"))
    fabric = int(env.get("FAKENVML_FABRIC", "0"))
    numa = env.get("FAKENVML_NUMA", "")
    nodes = numa.split(",") if numa else None
    gpus = []
    for i in range(n):
        if old_driver:
            node = -1  # no nvmlDeviceGetNumaNodeId
        elif nodes is None:
            node = i // 4
        else:
            node = -1 if i >= len(nodes) or nodes[i] in ("", "-") else int(nodes[i])
        if fabric == 0:
            fab = {"supported": False, "state": "not_supported", "status": "", "cluster_uuid": "",
                   "clique_id": 0, "usable": False}
        else:
            base = 0xB0 if old_driver else 0xA0  # the fake's v1 and V queries answer different clusters
            u = bytes(base + k for k in range(16)).hex()
            fab = {"supported": True, "state": "completed" if fabric == 1 else "in_progress", "status": "SUCCESS",
                   "cluster_uuid": f"{u[0:8]}-{u[8:12]}-{u[12:16]}-{u[16:20]}-{u[20:32]}",
                   "clique_id": 5 if old_driver else 7, "usable": fabric == 1}
        gpus.append({"index": i, "name": f"NVIDIA Fake H100 {i}",
                     "uuid": f"GPU-f0f1f2f3-f4f5-f6f7-f8f9-fafbfcfdfe{i:02x}",
                     "pci_bus_id": f"00000000:{0x1A + i:02X}:00.0", "pci_device_id": 0x233510DE,
                     "numa_node": node, "memory_total": 80 << 30, "fabric": fab})
    return {"driver_version": "555.42.06", "cuda_driver_version": 12050, "gpus": gpus,
            "fabric_capable": n > 0 and all(g["fabric"]["usable"] for g in gpus),
            "reason": "" if n > 0 else "NVML sees no GPU"}


def main():
    ap = argparse.ArgumentParser()
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-lib")
    src.add_argument("--from-stdin", action="store_true")
    ap.add_argument("--no-nvml", action="store_true")
    ap.add_argument("--old-driver", action="store_true")
    args = ap.parse_args()
    got = from_lib(args.from_lib) if args.from_lib else json.loads(sys.stdin.read())
    if args.no_nvml:
        want = {"driver_version": "", "cuda_driver_version": 0, "gpus": [], "fabric_capable": False,
                "reason": "no NVML (libnvidia-ml.so.1 not found): no GPU topology"}
    else:
        want = expected_fake(args.old_driver)
    if got != want:
        sys.exit(f"topology differs:\n got  {json.dumps(got, sort_keys=True)}\n want {json.dumps(want, sort_keys=True)}")
    print(f"ok: {len(got['gpus'])} GPU(s), reason {got['reason']!r}")


if __name__ == "__main__":
    main()

"""bench/compare's "Mooncake API on tent" and "NIXL API on tent" rows: the
real wheels' client loops of peers.py, unchanged, on tent.compat, every
point's data checked."""

import json
import os
import subprocess
import sys

from conftest import SOURCE_DIR

COMPARE_PY = os.path.join(SOURCE_DIR, "bench", "compare", "compare.py")


def test_compare_runs_the_client_loops_on_tent_and_checks_their_data(tmp_path):
    res = tmp_path / "results"
    p = subprocess.run([sys.executable, COMPARE_PY, "--engines", "mooncake-api-on-tent,nixl-api-on-tent",
                        "--runs", "1", "--block-size", "4K,64K", "--batch", "8", "--duration", "0.05",
                        "--iperf3-seconds", "1", "--results", str(res)],
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads((res / "compare.json").read_text())
    phases = {(m["engine"], m["phase"]) for m in data["medians"]}
    assert phases == {(e, ph) for e in ("mooncake-api-on-tent", "nixl-api-on-tent") for ph in ("batch", "one")}
    # batch: 2 ops x 2 sizes; one: 2 ops x 1 size -- every point's CRC-32 compared and right
    assert data["checked"] == {"mooncake-api-on-tent": 6, "nixl-api-on-tent": 6}
    assert data["problems"] == {}
    for raw in (res / "raw").glob("run1-*.jsonl"):
        with open(raw) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        assert recs[0]["type"] == "meta" and recs[0]["on_tent"] is True, raw
        points = [r for r in recs if r["type"] == "point"]
        assert points and all(r["check"] == "ok" for r in points), raw

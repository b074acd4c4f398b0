"""benchmarks/ncu_summary.py: Nsight Compute's details text and source CSV read into a
results page (no GPU: text shaped as ncu 2025 writes it)."""

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import ncu_summary  # noqa: E402

DETAILS = """[1357] python3.12@127.0.0.1
  my_kernel (256, 16, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    DRAM Throughput                   %        25.54
    Duration                         us       394.14
    Issue Slots Busy               %        41.40
    Executed Instructions                           inst  156,876,800
    Local Memory Spilling Requests                        3,457,024
    Registers Per Thread             register/thread             168
    Achieved Occupancy                        %        18.10
  other_kernel (2, 128, 1)x(512, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Duration                         us       136.96
"""

SASS = ('"Kernel Name","my_kernel",\n'
        '"Address","Source","stall_barrier","stall_long_sb","stall_long_sb (Not Issued)"\n'
        '"0","IMAD R1, R2","3","1","9"\n'
        '"10","LDS R3, [R4]","1","5","9"\n')


def test_details_and_stalls_read():
    launches = ncu_summary.read_details(DETAILS)
    assert [x["kernel"] for x in launches] == ["my_kernel", "other_kernel"]
    first = launches[0]
    assert first["grid"] == "256x16x1" and first["duration_us"] == 394.14
    assert first["instructions"] == 156876800 and first["spill_requests"] == 3457024
    assert first["registers"] == 168 and first["occupancy_pct"] == 18.1
    stalls = ncu_summary.read_stalls(SASS)
    # the "(Not Issued)" column is a subset of the same samples: not added
    assert stalls["my_kernel"] == {"barrier": 4, "long_sb": 6}
    rows = ncu_summary.rows(launches, stalls)
    assert rows[0]["value"] == 394.14 and "long_sb 60 %, barrier 40 %" in rows[0]["note"]
    assert "none read" in rows[1]["note"]


def test_cli_writes_a_page_and_refuses_missing_input(tmp_path):
    d, s, out = tmp_path / "d.txt", tmp_path / "s.csv", tmp_path / "page.json"
    d.write_text(DETAILS)
    s.write_text(SASS)
    script = Path(ncu_summary.__file__)
    common = ["--device", "GPU", "--commit", "abc", "--json", str(out)]
    ok = subprocess.run([sys.executable, script, "--details", d, "--sass", s, *common])
    assert ok.returncode == 0
    page = json.loads(out.read_text())
    assert page["benchmark"] == "ncu_bwd_h100" and len(page["rows"]) == 2
    bad = subprocess.run([sys.executable, script, "--details", tmp_path / "nope.txt",
                          "--sass", s, *common], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1

"""scripts/sm90_report.py's per-line SASS counts (SM90_LINES): read from nvdisasm's text, which
this test writes in its form (the tool itself needs triton's nvdisasm; the ws tests compile)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("sm90_report",
                                                  ROOT / "scripts" / "sm90_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


DISASM = """\
	.text.k:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
	//## File "/x/src/kdalab/kernels/chunk_prepare.py", line 81
        /*0010*/                   IADD3 R2, R3, 0x1000, RZ ;
        /*0020*/                   LOP3.LUT R2, R2, 0xffffe000, RZ, 0xc0, !PT ;
	//## File "/y/triton/language/standard.py", line 343 inlined at "chunk_prepare.py":244
        /*0030*/                   SHFL.UP PT, R4, R5, 0x1, RZ ;
	//## File "/x/src/kdalab/kernels/chunk_prepare.py", line 81
        /*0040*/                   IADD3 R6, R7, 0x1000, RZ ;
        /* comment, not an instruction */
"""


def test_sass_lines_counts_each_instruction_under_the_line_above_it():
    counts = _tool().sass_lines(DISASM)
    assert counts == {(None, 0): 1, ("chunk_prepare.py", 81): 3, ("standard.py", 343): 1}
    assert counts.most_common(1) == [(("chunk_prepare.py", 81), 3)]

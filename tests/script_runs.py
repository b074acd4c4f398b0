"""What the tests of the scripts that replay hunts share: running a script as the command it is
(a child process: the replay scripts define the kernels under TRITON_INTERPRET=1), and a small
draw of the output hunt's ridge to replay."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parents[1] / "scripts"

#: a small draw of the hunt's ridge (one key cluster, β -> 1, decay ≈ 1, v past fp16's range):
#: its output has tf32 products in stage 1 and in the state pass
RIDGE_SPEC = dict(T=40, batch=1, seqlens=None, heads=1, K=32, V=16, lower_bound=-1.06,
                  key_clusters=1, key_eps=0.011, beta_mean=11.6, beta_spread=0.74,
                  g_mean=-12.8, g_spread=0.2, log_decay=None, A_log=[0.85, 1.74],
                  dt_bias=[1.61, 2.56], v_scale=131072.0, initial_state="fp32",
                  state_scale=0.125, block=None, prenormalized=False, decay_range=None,
                  decay_channels=1.0, g_as_log_decay=None)


def run_script(name: str, *args, timeout: float = 900) -> subprocess.CompletedProcess:
    """``python scripts/NAME ARGS...``, its output captured."""
    return subprocess.run([sys.executable, str(SCRIPTS / name), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)

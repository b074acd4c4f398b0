#!/usr/bin/env python3
"""Where a CUDA process's start goes on the device host (issue 15: the whole `kdalab sweep`).

Each probe is a fresh child process (``os._exit`` at its end: no teardown counted), repeated
and interleaved so that the page cache treats every variant alike:

* ``import torch`` with torch's own switches: ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (no scan of
  every installed package's entry points) and ``TORCH_USE_RTLD_GLOBAL=1`` (libtorch loaded
  with lazy binding);
* CUDA's start after the import, with and without the driver started (``cuInit`` and the
  device's primary context, through ctypes) on a thread while torch imports;
* CuPy's import and kdalab's NVRTC module loaded from CuPy's cache;
* kdalab's command-line modules alone (no torch);
* ``import torch`` while four other processes import it (the command's helpers do).

Run from the repo root: ``python3 scripts/device/startup_probe.py [REPS]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

DRIVER = r"""
import ctypes, threading, time
_T0 = time.perf_counter()
_CU = {}
def _driver(ordinal=0):
    t = time.perf_counter()
    cu = ctypes.CDLL("libcuda.so.1")
    _CU["dlopen"] = time.perf_counter() - t
    t = time.perf_counter()
    assert cu.cuInit(0) == 0
    _CU["cuInit"] = time.perf_counter() - t
    dev = ctypes.c_int()
    assert cu.cuDeviceGet(ctypes.byref(dev), ordinal) == 0
    ctx = ctypes.c_void_p()
    t = time.perf_counter()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    _CU["retain"] = time.perf_counter() - t
"""

PROBES = {
    "torch": "import torch",
    "torch+cuda": "import torch\n_t=time.perf_counter()\ntorch.zeros(1, device='cuda')\n"
                  "torch.cuda.synchronize()\n_R['cuda']=time.perf_counter()-_t",
    "driver-thread+torch+cuda": DRIVER + "_th=threading.Thread(target=_driver, daemon=True)\n"
                  "_th.start()\nimport torch\n_R['imported']=time.perf_counter()-_T0\n"
                  "_t=time.perf_counter()\n_th.join()\n_R['join']=time.perf_counter()-_t\n"
                  "_t=time.perf_counter()\ntorch.zeros(1, device='cuda')\n"
                  "torch.cuda.synchronize()\n_R['cuda']=time.perf_counter()-_t\n_R.update(_CU)",
    "driver-alone": DRIVER + "_driver()\n_R.update(_CU)",
    "cupy": "import torch\ntorch.zeros(1, device='cuda')\n_t=time.perf_counter()\nimport cupy\n"
            "_R['import cupy']=time.perf_counter()-_t\n_t=time.perf_counter()\n"
            "from kdalab.arith.gpu import mma\nmma._module().get_function('mma_f16_acc')\n"
            "_R['module']=time.perf_counter()-_t",
    "kdalab-cli": "import kdalab.cli\nimport sys\n_R['torch loaded']=float('torch' in sys.modules)",
    "kdalab-cli+torch": "import kdalab.cli\nimport torch",
}

WRAP = """
import time, os, json, sys
_R = {{}}
_S = time.perf_counter()
{body}
_R['total'] = time.perf_counter() - _S
print('PROBE ' + json.dumps(_R), flush=True)
os._exit(0)
"""


def child(body: str, env_extra: dict[str, str]) -> dict:
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", WRAP.format(body=body)], env=env,
                         capture_output=True, text=True)
    wall = time.perf_counter() - t0
    line = next((x for x in res.stdout.splitlines() if x.startswith("PROBE ")), None)
    if line is None:
        return {"error": res.stderr[-400:], "wall": wall}
    out = json.loads(line[6:])
    out["wall"] = wall
    return out


def fmt(rows: list[dict]) -> str:
    keys = [k for k in rows[0] if k != "error"]
    med = {k: sorted(r.get(k, float("nan")) for r in rows)[len(rows) // 2] for k in keys}
    return "  ".join(f"{k} {v:.3f}" for k, v in med.items())


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    variants = {
        "default": {},
        "autoload=0": {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        "rtld-lazy": {"TORCH_USE_RTLD_GLOBAL": "1"},
    }
    runs: dict[str, list[dict]] = {}
    for _ in range(reps):
        for vname, env in variants.items():
            runs.setdefault(f"torch [{vname}]", []).append(child(PROBES["torch"], env))
        siblings = [subprocess.Popen([sys.executable, "-c", "import torch, time; "
                                      "time.sleep(4)"]) for _ in range(4)]
        runs.setdefault("torch [4 siblings importing]", []).append(child(PROBES["torch"], {}))
        for s in siblings:
            s.wait()
        for name in ("torch+cuda", "driver-thread+torch+cuda", "driver-alone", "cupy",
                     "kdalab-cli", "kdalab-cli+torch"):
            runs.setdefault(name, []).append(child(PROBES[name], {}))
    print(f"medians of {reps} (s; wall = the child process from spawn to exit):")
    for name, rows in runs.items():
        bad = [r["error"] for r in rows if "error" in r]
        print(f"  {name:28s} " + (f"ERROR {bad[0]}" if bad else fmt(rows)), flush=True)
    print("every run:", json.dumps(runs))


if __name__ == "__main__":
    main()

"""Each kernel in a process of its own: a kernel that leaves the GPU in an error state (an
illegal address poisons the CUDA context for the rest of its process), dies or hangs takes only
itself down. The case it was on is recorded as failed (``crashed: ...``), its later cases as
``skipped``, and the other kernels run as usual. Records are identical to an in-process run's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from kdalab.check import records as store
from kdalab.check.adapters import ConventionError
from kdalab.check.cases import Case
from kdalab.check.harness import Thresholds, blank_record
from kdalab.check.worker import EXIT_CONVENTION, EXIT_DEVICE_FAULT

__all__ = ["run_isolated"]


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as fh:
            return fh.read().count(b"\n")
    except FileNotFoundError:
        return 0


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()]
    except FileNotFoundError:
        return ""
    lines = [ln for ln in lines if ln]
    return lines[-1][:300] if lines else ""


def run_isolated(
    specs: Sequence[str],
    cases: Sequence[Case],
    *,
    suite: str,
    device: str,
    thresholds: Thresholds,
    against: str | None,
    folder: str | Path,
    sink: Callable[[list[dict]], None] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    timeout: float | None = None,
    timings: dict[str, float] | None = None,
    exclude: Mapping[str, Collection[str]] | None = None,
) -> list[dict]:
    """:func:`~kdalab.check.harness.run_check` with each kernel (``specs``, as
    :func:`~kdalab.check.adapters.load_kernel` takes them) in a worker process; ``timeout``
    seconds a kernel may go without finishing a case, its start and compilation included
    (None: no limit); ``exclude`` as run_check's. Work folders go under
    ``folder/parts`` and are removed for kernels that finished; a crashed kernel's log stays."""
    parts = Path(folder) / "parts"
    shutil.rmtree(parts, ignore_errors=True)  # never another run's logs or references
    total, out = len(cases) * len(specs), []
    for i, spec in enumerate(specs):
        part = parts / str(i)
        part.mkdir(parents=True)
        job = {"kernel": spec, "against": against, "device": device, "suite": suite,
               "cases": [asdict(c) for c in cases], "thresholds": asdict(thresholds),
               "exclude": sorted((exclude or {}).get(spec, ())), "out": str(part),
               "references": str(parts / "references")}
        (part / "job.json").write_text(json.dumps(job), encoding="utf-8")
        t0 = last = time.perf_counter()
        seen_count = 0
        with open(part / "stdout.log", "wb") as log, open(part / "stderr.log", "wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "kdalab.check.worker",
                                     str(part / "job.json")], stdout=log, stderr=err,
                                    stdin=subprocess.DEVNULL)
            timed_out = False
            while True:
                try:
                    rc = proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    rc = None
                done = min(_count_lines(part / "records.jsonl"), len(cases))
                if done > seen_count:
                    seen_count, last = done, time.perf_counter()
                if progress is not None:
                    label = cases[done].name if done < len(cases) else "done"
                    progress(i * len(cases) + done, total, f"{label} · {spec}")
                if rc is not None:
                    break
                if timeout and time.perf_counter() - last > timeout:
                    proc.kill()
                    proc.wait()
                    rc, timed_out = proc.returncode, True
                    break
        if timings is not None:
            timings[spec] = timings.get(spec, 0.0) + time.perf_counter() - t0
        message = _last_line(part / "stderr.log")
        if rc == EXIT_CONVENTION:
            raise ConventionError(message or f"kernel {spec!r} broke the convention")
        recs = store.read(part) if (part / "records.jsonl").exists() else []
        seen = {r["case"] for r in recs}
        missing = [c for c in cases if c.name not in seen]
        if missing:
            if timed_out:
                reason = f"no answer within {timeout:g} s (killed; --case-timeout)"
            elif rc == EXIT_DEVICE_FAULT:
                reason = message
            else:
                reason = f"its process exited with code {rc}" + (f": {message}" if message
                                                                 else "")
            for j, case in enumerate(missing):
                rec = blank_record(spec, case, device=device, thresholds=thresholds,
                                   against=against)
                if j == 0:
                    rec.update(status="fail", message=f"crashed: {reason} (log: {part})")
                else:
                    rec.update(status="skipped",
                               message=f"not run: the kernel crashed on {missing[0].name}")
                recs.append(rec)
        else:
            shutil.rmtree(part, ignore_errors=True)
        if sink is not None:
            sink(recs)
        out.extend(recs)
        if progress is not None:
            progress((i + 1) * len(cases), total, f"done · {spec}")
    shutil.rmtree(parts / "references", ignore_errors=True)
    if parts.exists() and not any(parts.iterdir()):
        parts.rmdir()
    order = {c.name: j for j, c in enumerate(cases)}
    return sorted(out, key=lambda r: (order[r["case"]], specs.index(r["kernel"])))

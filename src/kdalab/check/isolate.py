"""Each kernel in a process of its own: a kernel that leaves the GPU in an error state (an
illegal address poisons the CUDA context for the rest of its process), dies or hangs takes only
itself down. The case it was on is recorded as failed (``crashed: ...``), its later cases as
``skipped``, and the other kernels run as usual. Records are identical to an in-process run's.
A worker stopped by SIGINT or SIGTERM was interrupted with the run, not crashed: its cases get
no record (:class:`~kdalab.errors.Interrupted`), and ``--resume`` runs them (each worker is
given only its kernel's cases without a record).

The workers' files live in a temporary folder removed at the end, whatever happens: the job,
the records a worker streams back (JSON lines, read as they come and handed to ``sink`` at
once, so an interrupt keeps every case that finished) and the references the workers share
(the cases' fp64 and same-precision tensors, hundreds of MB for the full suite). Only a
crashed kernel's log is kept, in ``logs`` if given.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from kdalab.check.adapters import ConventionError
from kdalab.check.cases import Case
from kdalab.check.harness import Thresholds, blank_record
from kdalab.check.worker import CONVENTION
from kdalab.errors import Interrupted

__all__ = ["run_isolated"]


class _Lines:
    """The complete lines a worker has appended to its records file since the last call."""

    def __init__(self, path: Path):
        self.path, self._offset, self._tail = path, 0, b""

    def new(self) -> list[dict]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        *lines, self._tail = (self._tail + data).split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


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
    logs: str | Path | None = None,
    sink: Callable[[list[dict]], None] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    timeout: float | None = None,
    timings: dict[str, float] | None = None,
    exclude: Mapping[str, Collection[str]] | None = None,
    stored: Collection[tuple[str, str]] = (),
) -> list[dict]:
    """:func:`~kdalab.check.harness.run_check` with each kernel (``specs``, as
    :func:`~kdalab.check.builtin.load_kernel` takes them) in a worker process; ``timeout``
    seconds a kernel may go without finishing a case, its start and compilation included
    (None: no limit); ``exclude`` as run_check's. A crashed kernel's log is copied to the
    folder ``logs`` (None: not kept; its last line is in the record's message). ``stored``
    as run_check's: a kernel is given only its cases without a record (none: no worker), so
    a resumed run continues each kernel's case list where it stopped."""
    stored = set(stored)
    todo = [[c for c in cases if (c.name, spec) not in stored] for spec in specs]
    total, offset = sum(map(len, todo)), 0
    with tempfile.TemporaryDirectory(prefix="kdalab-check-") as work:
        out: list[dict] = []
        for i, spec in enumerate(specs):
            if todo[i]:
                out += _one_kernel(i, spec, todo[i], Path(work), suite=suite, device=device,
                                   thresholds=thresholds, against=against, logs=logs,
                                   sink=sink, progress=progress, timeout=timeout,
                                   timings=timings, exclude=exclude, at=(offset, total))
            offset += len(todo[i])
    order = {c.name: j for j, c in enumerate(cases)}
    return sorted(out, key=lambda r: (order[r["case"]], specs.index(r["kernel"])))


def _one_kernel(i, spec, cases, work: Path, *, suite, device, thresholds, against, logs,
                sink, progress, timeout, timings, exclude, at) -> list[dict]:
    """Kernel ``spec`` (the ``i``-th) on ``cases`` in a worker; ``at``: (pairs before this
    kernel's, all pairs), for ``progress``."""
    part = work / str(i)
    part.mkdir()
    job = {"kernel": spec, "against": against, "device": device, "suite": suite,
           "cases": [asdict(c) for c in cases], "thresholds": asdict(thresholds),
           "exclude": sorted((exclude or {}).get(spec, ())),
           "records": str(part / "stream.jsonl"), "references": str(work / "references"),
           "verdict": str(part / "verdict.json")}
    (part / "job.json").write_text(json.dumps(job), encoding="utf-8")
    (before, total), recs = at, []
    stream = _Lines(part / "stream.jsonl")

    def take() -> None:
        new = stream.new()
        if new:
            recs.extend(new)
            if sink is not None:
                sink(new)

    t0 = last = time.perf_counter()
    timed_out = False
    with open(part / "stdout.log", "wb") as log, open(part / "stderr.log", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "kdalab.check.worker",
                                 str(part / "job.json")], stdout=log, stderr=err,
                                stdin=subprocess.DEVNULL)
        try:
            while True:
                try:
                    rc = proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    rc = None
                before = len(recs)
                take()
                if len(recs) > before:
                    last = time.perf_counter()
                if progress is not None:
                    done = min(len(recs), len(cases))
                    label = cases[done].name if done < len(cases) else "done"
                    progress(before + done, total, f"{label} · {spec}")
                if rc is not None:
                    break
                if timeout and time.perf_counter() - last > timeout:
                    proc.kill()
                    proc.wait()
                    rc, timed_out = proc.returncode, True
                    break
        finally:
            if proc.poll() is None:  # interrupted: the worker goes too
                proc.kill()
                proc.wait()
    take()
    if timings is not None:
        timings[spec] = timings.get(spec, 0.0) + time.perf_counter() - t0
    message = _last_line(part / "stderr.log")
    verdict = _verdict(part / "verdict.json")
    if verdict is not None and verdict["kind"] == CONVENTION:
        raise ConventionError(verdict["message"])
    seen = {r["case"] for r in recs}
    missing = [c for c in cases if c.name not in seen]
    if missing and not timed_out and rc in (-signal.SIGINT, -signal.SIGTERM):
        # stopped from outside, not crashed: Ctrl-C reaches the whole foreground process
        # group and `timeout` signals its own, so the worker may see it before this process
        # does; its cases stay without a record, for --resume
        raise Interrupted(-rc, f"kernel {spec!r}: its process was stopped by a signal")
    if missing:
        if timed_out:
            reason = f"no answer within {timeout:g} s (killed; --case-timeout)"
        elif verdict is not None:  # the device in an error state
            reason = verdict["message"]
        else:
            reason = f"its process exited with code {rc}" + (f": {message}" if message else "")
        kept = _keep_log(part, logs, i, spec)
        crashed = []
        for j, case in enumerate(missing):
            rec = blank_record(spec, case, device=device, thresholds=thresholds,
                               against=against)
            if j == 0:
                rec.update(status="fail", message=f"crashed: {reason}"
                           + (f" (log: {kept})" if kept else ""))
            else:
                rec.update(status="skipped",
                           message=f"not run: the kernel crashed on {missing[0].name}")
            crashed.append(rec)
        recs.extend(crashed)
        if sink is not None:
            sink(crashed)
    if progress is not None:
        progress(before + len(cases), total, f"done · {spec}")
    return recs


def _verdict(path: Path) -> dict | None:
    """The worker's own verdict (:mod:`kdalab.check.worker`), or None when it wrote none: an
    exit code alone is the kernel's (it may end the process with any)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def _keep_log(part: Path, logs, i: int, spec: str) -> Path | None:
    """A crashed kernel's stderr (then its stdout) as ``logs/<i>-<kernel>.log``."""
    if logs is None:
        return None
    logs = Path(logs)
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / f"{i}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', spec)}.log"
    with open(path, "wb") as fh:
        for name in ("stderr.log", "stdout.log"):
            fh.write(f"--- {name} ---\n".encode())
            with open(part / name, "rb") as src:
                shutil.copyfileobj(src, fh)
    return path

"""One kernel's check in a process of its own (``python -m kdalab.check.worker JOB.json``), so
that a kernel which leaves the GPU in an error state, dies or hangs takes only itself down (see
:mod:`kdalab.check.isolate`). Records stream to the job's records file (JSON lines, flushed
as each case finishes), which the parent reads as they come and stores.

When the worker stops the check itself (the kernel broke the convention, or the device is in an
error state), it says so in the job's ``verdict`` file (JSON: ``kind``, ``message``) before it
exits with code 3 or 4. The parent decides from that file, not from the exit code: a kernel may
end its process with any code (``os._exit(3)``), and that is the kernel's crash, recorded as
its case's failure."""

from __future__ import annotations

import json
import sys
from pathlib import Path

EXIT_CONVENTION = 3
EXIT_DEVICE_FAULT = 4
#: the verdict file's kinds
CONVENTION, DEVICE_FAULT = "convention", "device fault"


def _shared_references(folder: Path, grad: bool):
    """The references (fp64 and same-precision), computed by the first worker that needs them
    and loaded from ``folder`` by the others (the token recurrences are the slow part of a
    worker's start); ``folder`` is the parent's temporary one, removed when the check ends."""
    import torch

    from kdalab.check.harness import case_references

    def get(case, x):
        path = folder / (case.name.replace("/", "__") + ".pt")
        if path.exists():
            return tuple(torch.load(path, map_location=x.q.device))
        refs = case_references(case, x, grad=grad)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(refs, tmp)
        tmp.replace(path)  # whole or absent, even if this worker dies
        return refs

    return get


def main(path: str) -> int:
    from kdalab.check.adapters import ConventionError
    from kdalab.check.builtin import load_kernel
    from kdalab.check.cases import Case
    from kdalab.check.harness import DeviceFault, Thresholds, run_check

    with open(path, encoding="utf-8") as fh:
        job = json.load(fh)
    cases = [Case(**{**c, "seqlens": None if c["seqlens"] is None else tuple(c["seqlens"])})
             for c in job["cases"]]
    kernel = load_kernel(job["kernel"])
    against = load_kernel(job["against"]) if job["against"] else None
    try:
        with open(job["records"], "a", encoding="utf-8") as fh:
            def sink(recs: list[dict]) -> None:
                # NaN and inf as JSON's extensions: json.loads gives the same floats back
                fh.write("".join(json.dumps(r) + "\n" for r in recs))
                fh.flush()

            run_check([kernel], cases, device=job["device"],
                      thresholds=Thresholds(**job["thresholds"]), against=against,
                      sink=sink, exclude={kernel.name: job["exclude"]},
                      references=_shared_references(Path(job["references"]),
                                                    job["thresholds"]["grad"]))
    except ConventionError as exc:
        return _stop(job, CONVENTION, exc, EXIT_CONVENTION)
    except DeviceFault as exc:
        return _stop(job, DEVICE_FAULT, exc, EXIT_DEVICE_FAULT)
    return 0


def _stop(job: dict, kind: str, exc: Exception, code: int) -> int:
    """The worker's own verdict, written whole (a temporary file renamed) before it exits."""
    print(exc, file=sys.stderr)
    path = Path(job["verdict"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"kind": kind, "message": str(exc)}), encoding="utf-8")
    tmp.replace(path)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""One kernel's check in a process of its own (``python -m kdalab.check.worker JOB.json``), so
that a kernel which leaves the GPU in an error state, dies or hangs takes only itself down (see
:mod:`kdalab.check.isolate`). Records stream into the job's folder as each case finishes.

Exit codes: 0 done, 3 the kernel broke the convention, 4 the device is in an error state (the
message is the last line on stderr)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

EXIT_CONVENTION = 3
EXIT_DEVICE_FAULT = 4


def _shared_references(folder: Path):
    """The fp64 references, computed by the first worker that needs one and loaded from
    ``folder`` by the others (the token recurrence is the slow part of a worker's start)."""
    import torch

    from kdalab.check.cases import reference

    def get(case, x):
        path = folder / (case.name.replace("/", "__") + ".pt")
        if path.exists():
            o, s = torch.load(path, map_location=x.q.device)
            return o, s
        o, s = reference(x)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save((o, s), tmp)
        tmp.replace(path)  # whole or absent, even if this worker dies
        return o, s

    return get


def main(path: str) -> int:
    from kdalab.check import records
    from kdalab.check.adapters import ConventionError, load_kernel
    from kdalab.check.cases import get_suite
    from kdalab.check.harness import DeviceFault, Thresholds, run_check

    with open(path, encoding="utf-8") as fh:
        job = json.load(fh)
    wanted = set(job["cases"])
    cases = [c for c in get_suite(job["suite"]) if c.name in wanted]
    kernel = load_kernel(job["kernel"])
    against = load_kernel(job["against"]) if job["against"] else None
    try:
        with records.writer(job["out"]) as w:
            run_check([kernel], cases, device=job["device"],
                      thresholds=Thresholds(**job["thresholds"]), against=against,
                      sink=w.write, exclude={kernel.name: job["exclude"]},
                      references=_shared_references(Path(job["references"])))
    except ConventionError as exc:
        print(exc, file=sys.stderr)
        return EXIT_CONVENTION
    except DeviceFault as exc:
        print(exc, file=sys.stderr)
        return EXIT_DEVICE_FAULT
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

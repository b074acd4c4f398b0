"""The one record store: a study's (or a tool's) records in Parquet parts keyed by run, with a
manifest that says what they are. Every study and check write here; views read from here.

The public API (what a tool needs to persist its records)::

    from kdalab.records import RunStore, StoreReader, StoreError, is_store, records_table

    store = RunStore.open(folder, kind="check", config={...}, runs=n, records_per_run=1,
                          schema=schema, resume=False, force=False)  # identity: kind, config,
                                                                     # schema, numerics version
    with store:                                   # closing marks it complete or interrupted
        store.append(records_table(dicts, schema, runs=[...]), group="part-name")
    StoreReader.read_only(folder, kind="check").frame()   # every record, a pandas DataFrame
    is_store(folder, kind="check")                # whether the folder holds such a store

* ``RunStore.open`` refuses (:class:`StoreError`, a ``ValueError`` naming ``--out``) a folder
  that holds another study, records of another numerics version, or files that are not a store,
  unless ``force``; a folder holding some of this study's runs needs ``resume`` (the runs
  stored are kept, the rest computed) or ``force``.
* Records carry ``run`` (0 … runs−1): the key of resume. A run's records are appended
  together; parts are written whole or not at all, so a kill at any moment loses at most the
  runs not yet in a part (:mod:`kdalab.records.writer`).
* The manifest's ``state`` says ``complete`` or ``interrupted`` once the store is closed.

Modules: :mod:`~kdalab.records.identity` (the folder's layout, manifest, fingerprint, lock),
:mod:`~kdalab.records.writer` (:class:`RunStore`), :mod:`~kdalab.records.reader`
(:class:`StoreReader`, :func:`identical`).
"""

from kdalab.records.identity import Manifest, StoreError, is_store, kdalab_version
from kdalab.records.reader import StoreReader, identical, records_table
from kdalab.records.writer import RunStore

__all__ = ["RunStore", "StoreReader", "StoreError", "Manifest", "identical", "is_store",
           "kdalab_version", "records_table"]

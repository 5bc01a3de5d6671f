"""Helpers shared by the test suite, imported as ``tests.support`` (``tests`` is a package).

- :mod:`.runtime`: scripted triggers, fast runner settings, log watching, a gated backend,
  and :class:`~.runtime.Signalling` (a watcher that signals after N committed events);
- :mod:`.daemons`: running the ``watchkeeper`` daemon as a real process, and
  :func:`~.daemons.wait_until`;
- :mod:`.postgres`: :func:`~.postgres.fresh_pg_database`, a new empty database per use;
- :mod:`.contract`: the store contract suite's scopes, snapshots and checks;
- :mod:`.values`: :func:`~.values.same`, equality that tells JSON types apart;
- :mod:`.chaos`: the chaos runs' plan, raw readers and checks.
"""

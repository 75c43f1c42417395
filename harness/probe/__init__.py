"""Per-label CPU measurements: plan → measure → classify → table / records / goldens.

``plan`` and ``sweep`` say which rows a model gets; ``runner`` measures each against the ``[]``
control; ``measurement/`` is how one row is measured and judged, ``workers/`` the processes a probe
runs in, ``layouts/`` the pipeline and tensor-parallel probes, ``present/`` what is shown to people.
"""

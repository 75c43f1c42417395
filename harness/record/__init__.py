"""Run records: the metric registry, the typed record, its schema, constructors, strict loading and atomic writing
(goldens: ``harness.golden``)."""

"""The run directory's only writer (:class:`uqh.harness.store.writer.RunStore`), its lock and its repair."""

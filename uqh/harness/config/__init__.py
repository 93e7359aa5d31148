"""From presets and overrides to a :class:`uqh.rundir.schema.RunConfig`, a domain and a client; the dry-run plan."""

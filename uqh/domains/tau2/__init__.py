"""The pieces behind the Tau2 domains, one job per module (``uqh/domains/tau2/domain.py`` registers the domains).

- :mod:`.access` -- lazy access to the ``tau2`` package and tau2 messages as JSON;
- :mod:`.actions` -- the agent's action grammar (``Tool[...]`` / ``Respond[...]``);
- :mod:`.shared_db` -- tau2 environments built from one parse of the domain DB per process (copy-on-write tables,
  DB hashes memoised by write history), also handed to tau2's evaluator;
- :mod:`.episode` -- one episode: tau2's orchestration stepped by our loop, endings mapped to stop reasons;
- :mod:`.replay` -- rebuilding an episode's state from its record, with the checks that refuse a forged prefix.

Nothing here is imported when the domains are listed; ``tau2`` itself is imported on first use.
"""

"""What several commands share: argument groups and output lines (a command never imports another command)."""
from __future__ import annotations


def add_backend_arguments(group) -> None:
    """``--backend`` and ``--ray-address`` (`uqh run`, `uqh continue`)."""
    group.add_argument("--backend", choices=("local", "ray"), default="local",
                       help="where episodes run: local (this machine; default) or ray (a Ray cluster; the run "
                            "directory is still written by this process only; docs/scale-out.md)")
    group.add_argument("--ray-address", metavar="ADDR",
                       help="with --backend ray: auto (the cluster this machine belongs to) or ray://HOST:PORT; "
                            "default: start a local Ray instance for this command")


def print_endpoint_lines(summary) -> None:
    """The per-endpoint call counts of a batch over several endpoints (nothing for one endpoint)."""
    from uqh.harness.model.endpoints import endpoint_summary_lines

    lines = endpoint_summary_lines(summary.endpoint_calls if summary is not None else [])
    if lines:
        print("\n".join(lines), flush=True)

"""`uqh schema`: print the run-directory JSON schemas."""
from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    from uqh.rundir.schema import export_json_schemas

    print(json.dumps(export_json_schemas(), indent=2))
    return 0

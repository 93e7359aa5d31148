"""`uqh schema`: print the run-directory JSON schemas."""
from __future__ import annotations

import argparse
import json

from uqh.rundir.schema import export_json_schemas


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    print(json.dumps(export_json_schemas(), indent=2))
    return 0

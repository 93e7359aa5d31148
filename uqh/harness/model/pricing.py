"""What a call cost: litellm's price map, read lazily (a price look-up on the direct path never imports litellm
for a model the bundled map does not have)."""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from functools import lru_cache
from pathlib import Path

from uqh.rundir.schema import Usage


@lru_cache(maxsize=1)
def _price_map_keys() -> frozenset[str]:
    """Model names in litellm's bundled price map, read without importing litellm (a multi-second import)."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "model_prices_and_context_window_backup.json"
        if path.is_file():
            return frozenset(json.loads(path.read_bytes()))
    return frozenset()


@lru_cache(maxsize=256)
def _is_priced(model: str) -> bool:
    if "litellm" not in sys.modules:
        # Shortcut for the direct path: a model absent from the bundled map is unpriced for litellm too.
        keys = _price_map_keys()
        names = {model, model.split("/", 1)[-1]}
        if keys and not names & keys:
            return False
    import litellm

    try:
        litellm.cost_per_token(model=model, prompt_tokens=1, completion_tokens=1)
    except Exception:  # noqa: BLE001 - litellm raises a plain Exception for unmapped models
        return False
    return True


def cost_usd(model: str, usage: Usage) -> float | None:
    """USD cost of one call from litellm's price map; ``None`` when the model is unpriced or usage unknown.

    Cached prompt tokens (reads and writes, both part of ``prompt_tokens``) are priced at the map's cache rates
    where it has them (litellm falls back to the input rate where it has none)."""
    if usage.prompt_tokens is None or usage.completion_tokens is None or not _is_priced(model):
        return None
    import litellm

    try:
        prompt_cost, completion_cost = litellm.cost_per_token(
            model=model, prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
            cache_read_input_tokens=usage.cached_prompt_tokens or 0,
            cache_creation_input_tokens=usage.cache_write_prompt_tokens or 0,
        )
    except Exception:  # noqa: BLE001
        return None
    total = float(prompt_cost) + float(completion_cost)
    return total if math.isfinite(total) else None

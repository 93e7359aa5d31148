"""ReAct harness: prompting, parsing, model client, loop, run store, batch runner."""
import os

# litellm must not try the network for its cost map at import time.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__version__ = "0.1.0"

"""The prompts as package data: Appendix K's system prompts (``<domain>.txt``), the four-tag grammar
(``four_tags.gbnf``) and the GPA judges' templates (``judges/``). Found next to this file in a wheel too."""
from pathlib import Path

PROMPTS_DIR = Path(__file__).resolve().parent

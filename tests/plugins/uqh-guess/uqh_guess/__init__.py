"""An example uqh plugin (see pyproject.toml): everything a domain needs sits in this folder."""

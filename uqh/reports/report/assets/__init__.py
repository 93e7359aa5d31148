"""Inline CSS/JS of the HTML report (a package so that setuptools ships the files)."""

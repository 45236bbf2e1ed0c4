"""The documentation site's sources (mkdocs.yml builds them) and its generator, `python -m docs.generate`."""

"""A recipe file to a Bridge ``ConfigContainer``: Bridge's recipe function, the YAML, then ``key=value`` overrides,
each key checked strictly (:mod:`~bridge_cudagraph.recipe.load`), Bridge's config reads answered offline."""

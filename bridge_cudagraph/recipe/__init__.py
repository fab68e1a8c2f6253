"""A recipe file to a Bridge ``ConfigContainer``: Bridge's recipe function, the YAML, then ``key=value`` overrides,
each key checked strictly (:mod:`~bridge_cudagraph.recipe.load`), Bridge's config reads answered offline
(:mod:`~bridge_cudagraph.recipe.offline`)."""


class RecipeError(ValueError):
    """A recipe file or override that cannot be loaded; the message names the key and the fix."""

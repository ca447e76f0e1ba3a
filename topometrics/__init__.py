"""topometrics: does the topology of a transformer's weights and representations track its training?

``topometrics.features_of(model_or_folder)``: the feature rows of a model or a folder of checkpoints
(:func:`topometrics.series.api.features_of`). The pipeline's stages are ``stages/*.py`` (docs/layout.md).
"""

__version__ = "0.1.0"


def features_of(model_or_folder, **options):
    """:func:`topometrics.series.api.features_of` (imported on first use: ``import topometrics`` stays light)."""
    from topometrics.series.api import features_of as one_call

    return one_call(model_or_folder, **options)

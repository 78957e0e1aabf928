"""Hugging Face models: reading ``config.json`` into layouts, and cross-checks against ``transformers`` modules.

``config``   whole-model counts from a config.json: the registry of model_type -> mapper, the CLI's ``--config``
``read``     the checked config reader, layer groups, and the registry the mappers join
``models``   the mappers of further model types
``modules``  cross-checks of each family's layer against the ``transformers`` attention module it models
"""

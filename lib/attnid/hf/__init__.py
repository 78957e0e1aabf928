"""Hugging Face models: ``config.json`` into layouts, cross-checks against ``transformers``, trained checkpoints.

``config``   whole-model counts from a config.json: the registry of model_type -> mapper, the CLI's ``--config``
``read``     the checked config reader, layer groups, and the registry the mappers join
``models``   the mappers of further model types
``modules``  cross-checks of each family's layer against the ``transformers`` attention module it models
``same_weights`` a module and attnid's layer on the same weights: the relative error the cross-checks report
``checkpoint`` trained checkpoints (a safetensors folder or a GGUF file), checked, then read one layer at a time
``atpoint``  the count at a given point (the dense Jacobian, or the at-point theorem's conditions), dead parameters
``inspect``  ``attnid inspect``: a checkpoint's layers at their own weights
``rebalance`` ``attnid rebalance``: the same function at the balanced point of its orbit, checked, written atomically
``commands`` the two subcommands' parsers and runners; ``pretrained`` where the two pinned pretrained models are
``gguf_file`` a GGUF file's index and tensors, read within bounds; ``errors`` the one ``CheckpointError``
``whole``    ``--whole-model``: a config's whole-model layout and count; ``whole_jacobian`` its float64 Jacobian check
``quantize`` round-to-nearest quantisation of a checkpoint's attention before and after orbit moves
"""

"""The training machinery of the book's experiments: problems, optimisers, sweeps and their statistics.

``training``     training problems, invisible shares of updates, projection and balancing
``trainsweep``   the teacher-student sweeps of the training chapters
``rebalancing``  the rebalancing experiments: one run, what counts as unstable, each arm's tuned rate
``textmodel``    a byte-level transformer on the pinned sympy source: the real-text experiment
``textsym``      the text model's symmetry directions; ``modelsym`` a model's per-layer orbit
``residual``     the residual stream's rotations about the ones vector (LayerNorm models)
``spans``        the orbit's span from one Gram matrix per point, without forming its basis
``tangent``      the same shares in closed form (Sylvester solves), for layers too large for ``spans``
``finetune``     all-MiniLM-L6-v2 fine-tuned on CPU to tell SymPy's subpackages by their docstrings
``curvature``    Hessian of a training loss w.r.t. the attention layer, and its sharpness
``sweep``        a sweep's runs over local cores or a Dask cluster (joblib), results in task order
``stats``        paired comparisons over seeds (median difference, bootstrap interval) and chance shares
``multitest``    exact paired signed-rank tests and Holm's correction
"""

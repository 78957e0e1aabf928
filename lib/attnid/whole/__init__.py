"""The whole model: the symmetry count of a transformer stack beyond its attention layers.

``model``     the layout of a stack (tables, norms, attention groups, MLP, head) and its closed-form count
``symbolic``  exact SymPy checks of the identities behind the moves
(the Hugging Face side, configs and the numeric Jacobian check, lives in ``attnid.hf.whole`` and
``attnid.hf.whole_jacobian``).
"""

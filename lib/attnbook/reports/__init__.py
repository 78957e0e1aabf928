"""What a chapter computes from its data: comparisons, tables and figures (no experiment imports these).

``training``     chapter 11's training shares, float32 against float64, conservation
``key_bias``     chapter 11's dead key bias; ``sweep`` its rate x width sweep
``rebalancing``  chapter 12's rebalancing comparisons, tables and figure
``real_text``    chapter 13's real-text model; ``real_text_rebalancing`` its rebalanced runs
``trained_models`` chapter 14's check of the at-point theorem, the two pretrained models, quantisation
"""

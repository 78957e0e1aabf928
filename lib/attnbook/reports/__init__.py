"""What a chapter computes from its data: comparisons, tables and figures (no experiment imports these).

``training``     chapter 11's training shares, float32 against float64, conservation
``rebalancing``  chapter 12's rebalancing comparisons, tables and figure
``real_text``    chapter 13's real-text model
"""

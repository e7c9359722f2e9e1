"""Helpers of the command-line drivers, not part of the library API: the result files of the comparison drivers and
GPU scripts (:mod:`~lightvision.tools.results`) and the attention-map figures
(:mod:`~lightvision.tools.attention_figures`). Used by ``lightvision.classify`` / ``lightvision.diffusion``'s
``benchmark`` and ``attention_maps`` modules and by ``scripts/``; the library (``ops``, ``layers``, ``engine``,
``kernels``) never imports them.
"""

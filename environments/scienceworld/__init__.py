"""ScienceWorld (the "Science" family): 30 tasks, 7,207 variations, official splits, pooled JVMs.

See ``env.py`` for the episode protocol and ``pool.py`` for how simulators are shared.
"""

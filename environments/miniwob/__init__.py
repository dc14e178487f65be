"""MiniWoB++ web navigation over a text view of the page (headless Chromium via chromedriver).

See ``env.py`` for the episode protocol, ``dom_text.py`` for the observation, ``actions.py`` for
the action language and ``catalog.py`` for the supported tasks and seeds.
"""

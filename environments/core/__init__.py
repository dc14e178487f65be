"""Shared pieces of every environment family: the contract (``base``), the HTTP server core
(``server``), its command line (``cli``) and the client (``client``).

Importing this package is cheap; the submodules import aiohttp only when used.
"""

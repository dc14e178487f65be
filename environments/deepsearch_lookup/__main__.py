"""``python -m environments.deepsearch_lookup [options]``: the options of ``python -m
environments.deepsearch``, serving the ``lookup`` task set."""

import sys

from environments.deepsearch.__main__ import serve

serve("deepsearch_lookup", sys.argv[1:])

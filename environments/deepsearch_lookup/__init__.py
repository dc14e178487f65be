"""The ``deepsearch_lookup`` family's server module: deep search over the ``lookup`` task set
(the family itself is defined in ``environments/deepsearch/family.py``)."""
